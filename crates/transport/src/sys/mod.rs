//! Thin safe wrappers over the Linux calls the soft provider needs.
//!
//! All raw-pointer and libc work of the soft provider lives here, each `unsafe` block with a
//! `// SAFETY:` comment. Everything exported is safe to call with any argument: bounds and
//! alignment are checked before memory is touched.

mod epoll;
mod event;
mod fd_passing;
pub(crate) mod life;
mod output;
mod poll;
pub mod process;
mod random;
mod shared_memory;
mod word_copy;

pub(crate) use epoll::{Epoll, READ, WRITE};
pub(crate) use event::{Doorbell, EventFd, RemoteDoorbell};
pub(crate) use fd_passing::{recv_with_fd, send_with_fd};
pub(crate) use output::OutputQueue;
pub use poll::poll_readable;
#[cfg(feature = "rdma")]
pub(crate) use poll::set_nonblocking;
pub(crate) use random::random_u64;
pub(crate) use shared_memory::{Protection, Release, SharedMemory};
