//! The spawner thread every child is forked from (see the module above for why), and the user a
//! child may run as.

use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::thread;

type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnJob>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        thread::Builder::new()
            .name("dlock-test-servers-spawner".into())
            .spawn(move || {
                // The sender lives in a static, so this loop (and the thread) lasts until the process exits.
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("cannot start the dlock-test-servers spawner thread");
        Mutex::new(tx)
    })
}

/// Spawns `command` from the spawner thread, as the leader of a new process group, with PDEATHSIG set, and
/// (when `run_as` is set) with the given user and group ids.
pub(super) fn spawn(mut command: Command, run_as: Option<RunAs>) -> io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    command.process_group(0);
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe system calls.
    unsafe {
        command.pre_exec(move || {
            if let Some(RunAs { uid, gid }) = run_as {
                if libc::setgroups(1, &gid) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            // After the credential change: changing the uid clears the parent-death signal.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((command, tx))
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("spawner thread is gone"))?
}

/// A user and group to run a child as (Postgres refuses to run as root).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunAs {
    pub(crate) uid: libc::uid_t,
    pub(crate) gid: libc::gid_t,
}

impl RunAs {
    /// Looks up a user by name.
    pub(crate) fn user(name: &str) -> Option<RunAs> {
        let cname = std::ffi::CString::new(name).ok()?;
        // SAFETY: getpwnam returns a pointer to static storage or null; we copy the two ids out at once.
        let pw = unsafe { libc::getpwnam(cname.as_ptr()) };
        if pw.is_null() {
            return None;
        }
        // SAFETY: checked non-null above.
        let pw = unsafe { &*pw };
        Some(RunAs {
            uid: pw.pw_uid,
            gid: pw.pw_gid,
        })
    }

    /// Gives `path` to this user.
    pub(crate) fn chown(&self, path: &Path) -> io::Result<()> {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
    }
}
