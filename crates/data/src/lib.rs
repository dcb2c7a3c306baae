//! kvcm-data: the data plane's block I/O against the file tier (an NFS directory or a 3FS
//! mount).
//!
//! The server hands out location URIs (wire fact sheet §14); [`parse_block_uri`] turns one into
//! a [`FileBlockLocation`] (file, byte offset = blkid × size, length = size), and [`FileIo`]
//! moves many blocks in one batched call, through io_uring where the kernel allows it and
//! with `pread`/`pwrite` otherwise. Every op reports the [`IoPath`] that ran, so neither the
//! psync fallback nor the buffered fallback of O_DIRECT is ever silent.
//!
//! The byte layout is wire-visible (reference connectors read the same files), so it is exact:
//! block `i` of a file with blocks of `size` bytes lives at `[i × size, (i + 1) × size)`.

mod aligned;
mod error;
mod file_io;
mod uri;

pub use aligned::{AlignedBuf, BUFFER_ALIGN};
pub use error::DataError;
pub use file_io::{
    DirectMode, FileIo, FileIoConfig, IoBackend, IoPath, ReadOp, WriteOp, DIRECT_IO_ALIGN,
};
pub use uri::{check_under_root, parse_block_uri, FileBlockLocation, FileScheme};
