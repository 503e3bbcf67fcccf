//! What semaphores share across backends: the refusal of a backend without them, and the
//! refusal of a number of permits other than the one a name is in use with.

use crate::error::LockError;

/// [`LockError::Unsupported`] for a semaphore call on a backend without semaphores.
pub(crate) fn unsupported(backend: &'static str) -> LockError {
    LockError::Unsupported {
        backend,
        operation: "semaphores",
    }
}

/// [`LockError::InvalidArgument`] for asking `asked` permits of `name`, which is in use with
/// `in_use` (a lock being a semaphore of one permit): two numbers for one name would let more
/// holders in than either client expects.
pub fn permits_mismatch(name: &crate::LockName, asked: u32, in_use: u32) -> LockError {
    let as_what = |n: u32| {
        if n == 1 {
            "a lock (one permit)".to_owned()
        } else {
            format!("a semaphore of {n} permits")
        }
    };
    LockError::invalid(
        "permits",
        format!(
            "`{name}` is in use as {}; asked as {}",
            as_what(in_use),
            as_what(asked)
        ),
    )
}
