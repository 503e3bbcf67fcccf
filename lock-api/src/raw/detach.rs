use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future that runs to completion even when its caller drops it: polled in place while the
/// caller waits (no task hop on the fast path), and moved into a spawned task if the caller goes
/// away first (a `select!`, a timeout, an aborted task), which [`settle`](super::settle) waits for.
///
/// Wrap every step whose effects must not be cut in half: a statement on a connection (so the
/// connection is never left mid-protocol), a release together with the client's record of it
/// (so an abort between the server's reply and the bookkeeping cannot wedge the client).
/// Outside a tokio runtime a dropped `Detach` drops its future, with a warning.
#[must_use = "futures do nothing unless awaited"]
pub struct Detach<F: Future + Send + 'static>
where
    F::Output: Send + 'static,
{
    future: Option<Pin<Box<F>>>,
}

impl<F: Future + Send + 'static> Detach<F>
where
    F::Output: Send + 'static,
{
    /// Wraps `future`; it starts when first polled.
    pub fn new(future: F) -> Self {
        Self {
            future: Some(Box::pin(future)),
        }
    }
}

impl<F: Future + Send + 'static> Future for Detach<F>
where
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(future) = self.future.as_mut() else {
            panic!("Detach polled after completion");
        };
        let output = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(output)
    }
}

impl<F: Future + Send + 'static> Drop for Detach<F>
where
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let Some(future) = self.future.take()
            && !super::spawn_cleanup(future)
        {
            tracing::warn!(
                "dlock: an operation was cut off outside a tokio runtime and cannot finish"
            );
        }
    }
}

impl<F: Future + Send + 'static> fmt::Debug for Detach<F>
where
    F::Output: Send + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Detach")
            .field("running", &self.future.is_some())
            .finish()
    }
}
