//! Errors of the manager layer. The service edge maps them to wire status codes in one place.

use kvcm_index::IndexError;
use kvcm_storage::StorageError;

/// Why a manager operation failed. Every failure leaves the manager's state unchanged unless
/// the variant says otherwise.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// A request field is missing or invalid; the message names it.
    #[error("missing or invalid fields: {0}")]
    InvalidArgument(String),
    /// The operation exists in the reference but has no sound meaning here.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The entity exists with different content.
    #[error("duplicate entity: {0}")]
    Duplicate(String),
    /// No instance with this id is registered.
    #[error("instance {0:?} does not exist")]
    InstanceNotExist(String),
    /// This node is not the leader.
    #[error("Server is not leader")]
    NotLeader,
    /// A named entity (group, storage, account, session) is unknown.
    #[error("{0}")]
    NotFound(String),
    /// A named entity already exists.
    #[error("{0}")]
    AlreadyExists(String),
    /// No storage can take the write, or a quota is reached.
    #[error("no space: {0}")]
    NoSpace(String),
    /// The request cannot be carried out as asked (an unknown query type, spec groups that do
    /// not fit, a stale group version, an index the group's settings cannot open); the
    /// reference answers these as generic manager failures (INTERNAL_ERROR).
    #[error("request refused: {0}")]
    Refused(String),
    /// Some blocks of a request could not be committed.
    #[error("partial failure: {0}")]
    Partial(String),
    /// The metadata index failed.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// A storage backend failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A background thread could not be started.
    #[error("starting a background thread: {0}")]
    Thread(std::io::Error),
}

/// Result of manager operations.
pub type ManagerResult<T> = Result<T, ManagerError>;

/// Shorthand for an `InvalidArgument` naming the API and field.
pub fn invalid(api: &str, field: &str) -> ManagerError {
    ManagerError::InvalidArgument(format!("{{{api}: {{{field}}}}}"))
}
