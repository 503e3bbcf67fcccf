//! Worker **tasks**, for a deployment that lives in this process (the memory backend), where no
//! child process can reach it. They run the same rounds as worker processes, and the harness
//! does to them what signals do to a process: a paused task is not polled and its client's link
//! is cut (so its renewals fail, as a stopped process's stop); a killed task is aborted with its
//! link cut for good (so its dropped guards cannot release, as a dead process's cannot).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::worker::{WorkerSpec, run_rounds};
use super::{Body, WorkerProcess};
use crate::{ClientLink, Failure, Harness};

/// Starts a worker task running `spec` on a fresh client of `harness`.
pub(super) fn spawn(harness: &dyn Harness, spec: &WorkerSpec) -> Result<WorkerProcess, Failure> {
    let faults = harness
        .faults()
        .ok_or_else(|| Failure("the harness has no fault hooks".into()))?;
    let (client, link) = faults.task_client().map_err(Failure)?;
    let (lines, said) = mpsc::unbounded_channel();
    let gate = Arc::new(Gate::default());
    let rounds = {
        let spec = spec.clone();
        async move {
            let say = move |line: &str| {
                lines
                    .send(line.to_owned())
                    .map_err(|_| "the harness stopped listening".to_owned())
            };
            run_rounds(client, spec, &say).await
        }
    };
    let handle = tokio::spawn(Pausable {
        gate: gate.clone(),
        inner: Box::pin(rounds),
    });
    Ok(WorkerProcess {
        worker: spec.worker,
        body: Body::Task(WorkerTask {
            handle,
            said,
            gate,
            link,
        }),
    })
}

pub(super) struct WorkerTask {
    handle: JoinHandle<Result<(), String>>,
    said: mpsc::UnboundedReceiver<String>,
    gate: Arc<Gate>,
    link: Box<dyn ClientLink>,
}

impl WorkerTask {
    pub(super) fn pause(&self) {
        self.link.cut();
        self.gate.pause();
    }

    pub(super) fn resume(&self) {
        self.link.restore();
        self.gate.resume();
    }

    pub(super) async fn kill(&self) {
        self.link.cut();
        self.handle.abort();
        // Its future (and every guard in it) is dropped once the abort lands.
        while !self.handle.is_finished() {
            tokio::task::yield_now().await;
        }
    }

    pub(super) async fn next_line(&mut self) -> Option<String> {
        self.said.recv().await
    }

    pub(super) async fn finish(self) -> Result<(), String> {
        match self.handle.await {
            Ok(outcome) => outcome,
            Err(error) => Err(format!("the worker task ended: {error}")),
        }
    }
}

/// Whether a worker task may run; a paused one is not polled until resumed.
#[derive(Default)]
struct Gate {
    paused: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Gate {
    fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }

    fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
        let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// A future that is not polled while its gate is paused: the task's stand-in for `SIGSTOP`.
struct Pausable<F> {
    gate: Arc<Gate>,
    inner: Pin<Box<F>>,
}

impl<F: Future> Future for Pausable<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if self.gate.paused.load(Ordering::SeqCst) {
            *self.gate.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
            // Resumed between the check and storing the waker: it found no waker to wake.
            if self.gate.paused.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
        }
        self.inner.as_mut().poll(cx)
    }
}
