//! Errors of the manager layer. They are typed and keep their sources; the service edge turns
//! them into wire status codes and the reference's message texts in one place.

use kvcm_index::IndexError;
use kvcm_storage::StorageError;

/// Why a manager operation failed. Every failure leaves the manager's state unchanged unless
/// the variant says otherwise.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// A request field is missing or invalid. `field` is its dotted path in the request;
    /// `detail` (possibly empty) says what is wrong.
    #[error("invalid field {field}: {detail}")]
    InvalidField {
        /// Dotted path of the field.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// A storage config cannot be used (the storage error says why).
    #[error(transparent)]
    InvalidStorage(StorageError),
    /// The operation exists in the reference but has no sound meaning here.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The entity exists with different content.
    #[error("duplicate entity: {0}")]
    Duplicate(String),
    /// No instance with this id is registered.
    #[error("instance {0:?} does not exist")]
    InstanceNotExist(String),
    /// The instance's group lists no event-report storage of the reporting tier (upstream
    /// answers this INSTANCE_NOT_EXIST too).
    #[error("no event-report storage: {0}")]
    NoReportStorage(String),
    /// This node is not the leader.
    #[error("Server is not leader")]
    NotLeader,
    /// A configured limit on open entities is reached (the message names its key).
    #[error("{0}")]
    Capacity(String),
    /// A named entity (group, storage, account, session) is unknown.
    #[error("{0}")]
    NotFound(String),
    /// A named entity already exists.
    #[error("{0}")]
    AlreadyExists(String),
    /// No storage can take the write, or a quota is reached.
    #[error("no space: {0}")]
    NoSpace(String),
    /// The request cannot be carried out as asked (spec groups that do not fit, a stale group
    /// version); the reference answers these as generic manager failures.
    #[error("request refused: {0}")]
    Refused(String),
    /// A group's index settings cannot open an index.
    #[error("opening the index: {0}")]
    OpenIndex(#[source] IndexError),
    /// Some blocks of a request could not be committed.
    #[error("partial failure: {0}")]
    Partial(String),
    /// The metadata index failed.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// A storage backend failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The journal failed or refused the change (see `JournalError`).
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    /// A background thread could not be started.
    #[error("starting a background thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl ManagerError {
    /// `InvalidField` without detail.
    pub fn invalid(field: &'static str) -> ManagerError {
        ManagerError::InvalidField {
            field,
            detail: String::new(),
        }
    }

    /// `InvalidField` with a detail.
    pub fn invalid_because(field: &'static str, detail: impl Into<String>) -> ManagerError {
        ManagerError::InvalidField {
            field,
            detail: detail.into(),
        }
    }
}

/// Result of manager operations.
pub type ManagerResult<T> = Result<T, ManagerError>;
