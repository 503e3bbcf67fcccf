//! The control methods every single-process server handle offers, generated for each handle type, and
//! [`ServerProcess`], the same methods behind one object-safe trait for code that handles any server.

/// One server process the harness started, whatever it serves: what a fault test does to it.
pub trait ServerProcess: Send + Sync {
    /// Where it listens.
    fn addr(&self) -> std::net::SocketAddr;
    /// A client URL for it.
    fn url(&self) -> String;
    /// Kills it with SIGKILL (a crash); its directory and port stay for [`restart`](Self::restart).
    fn kill(&self);
    /// Stops it if it runs and starts it again on the same port and directory, waiting until it answers.
    ///
    /// # Errors
    /// When it does not come back.
    fn restart(&self) -> crate::Result<()>;
    /// Freezes it (SIGSTOP): connections stay open, nothing is answered.
    fn pause(&self);
    /// Thaws it (SIGCONT).
    fn resume(&self);
}

/// Implements `pid`, `kill`, `stop`, `restart`, `pause`, `resume`, … on a handle type with a `proc: Proc` field,
/// and `Debug` as its address and pid (`process_control!(Type, custom_debug)` leaves `Debug` to the type).
macro_rules! process_control {
    ($ty:ident) => {
        process_control!($ty, custom_debug);

        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("addr", &self.addr())
                    .field("pid", &self.pid())
                    .finish()
            }
        }
    };
    ($ty:ident, custom_debug) => {
        impl $crate::ServerProcess for $ty {
            fn addr(&self) -> std::net::SocketAddr {
                $ty::addr(self)
            }
            fn url(&self) -> String {
                $ty::url(self)
            }
            fn kill(&self) {
                $ty::kill(self)
            }
            fn restart(&self) -> $crate::Result<()> {
                $ty::restart(self)
            }
            fn pause(&self) {
                $ty::pause(self)
            }
            fn resume(&self) {
                $ty::resume(self)
            }
        }

        impl $ty {
            /// The server's process id, or `None` while it is not running (after [`kill`](Self::kill) or
            /// [`stop`](Self::stop)).
            pub fn pid(&self) -> Option<u32> {
                self.proc.pid()
            }

            /// Whether the server process is alive (a paused process is alive).
            pub fn is_running(&self) -> bool {
                self.proc.is_running()
            }

            /// Whether the server is paused by [`pause`](Self::pause).
            pub fn is_paused(&self) -> bool {
                self.proc.is_paused()
            }

            /// Kills the server with SIGKILL (a crash: no shutdown, open connections are reset) and waits for it
            /// to die. Its directory and port stay reserved for [`restart`](Self::restart). Does nothing if it
            /// is not running.
            pub fn kill(&self) {
                self.proc.kill()
            }

            /// Shuts the server down cleanly (its own stop signal; a paused server is resumed first), waiting up
            /// to 10 s before it kills. Its directory and port stay for [`restart`](Self::restart).
            pub fn stop(&self) {
                self.proc.stop()
            }

            /// Stops the server if it runs, starts it again on the same port with the same directory, and waits
            /// until it answers. What survives depends on the server's persistence (see the type's docs).
            ///
            /// # Errors
            /// [`ServerError::StartFailed`](crate::ServerError::StartFailed) when it does not come back.
            pub fn restart(&self) -> $crate::Result<()> {
                self.proc.restart().map(drop)
            }

            /// Freezes the server (SIGSTOP to its process group): connections stay open, nothing is answered.
            /// Undo with [`resume`](Self::resume); dropping a paused handle is fine.
            pub fn pause(&self) {
                self.proc.pause()
            }

            /// Thaws a server frozen by [`pause`](Self::pause) (SIGCONT).
            pub fn resume(&self) {
                self.proc.resume()
            }

            /// How long the last start or restart took until the server answered.
            pub fn started_in(&self) -> std::time::Duration {
                self.proc.started_in()
            }

            /// The server's private directory (removed when the handle is dropped).
            pub fn dir(&self) -> &std::path::Path {
                self.proc.dir()
            }

            /// The file the server's output goes to (it survives restarts, it is appended to).
            pub fn log_path(&self) -> &std::path::Path {
                self.proc.log_path()
            }

            /// The last `lines` lines of the server's log, indented, for failure messages.
            pub fn log_tail(&self, lines: usize) -> String {
                self.proc.log_tail(lines)
            }

            /// The command line the server runs with.
            pub fn command_line(&self) -> String {
                self.proc.command_line()
            }
        }
    };
}

pub(crate) use process_control;
