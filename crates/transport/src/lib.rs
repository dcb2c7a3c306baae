//! kvcm-transport: one verbs-shaped API over several RDMA providers.
//!
//! Placeholder: the transport issue fills this crate in.
