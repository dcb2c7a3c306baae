//! Accounts: the reference's user accounts with roles (ROLE_OPERATOR is kvcm's extension).
//! An account authenticates through its API keys ([`crate::api_keys`]); its password is kept
//! only as a salted hash ([`crate::password`]) and never returned.

use super::error::{ManagerError, ManagerResult};
use super::journal::Record;
use super::Manager;
use crate::password::StoredPassword;
use crate::sync::lock;

/// What an account may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountRole {
    /// An ordinary user.
    User,
    /// An administrator.
    Admin,
    /// kvcm's extension: runs the registry (storages, groups, instances) and the meta API of
    /// every instance, but manages no accounts, keys or admin tokens.
    Operator,
}

/// One account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Unique user name.
    pub user_name: String,
    /// The password: `Clear` as a caller gives it (or an older build's record holds it),
    /// hashed by [`Manager::add_account`] before it is kept or recorded (the reference
    /// stores it in clear).
    pub password: StoredPassword,
    /// Its role.
    pub role: AccountRole,
}

/// The error for an account name that is taken.
fn already_exists(user_name: &str) -> ManagerError {
    ManagerError::AlreadyExists(format!("account {user_name:?} already exists"))
}

impl Manager {
    /// Adds an account (a clear password is hashed first, outside the accounts' lock); an
    /// existing name is an error, found before any hashing.
    pub fn add_account(&self, mut account: Account) -> ManagerResult<()> {
        if account.user_name.is_empty() {
            return Err(ManagerError::invalid("user_name"));
        }
        if lock(&self.accounts).contains_key(&account.user_name) {
            return Err(already_exists(&account.user_name));
        }
        account.password = account.password.hashed();
        let mut accounts = lock(&self.accounts);
        if accounts.contains_key(&account.user_name) {
            return Err(already_exists(&account.user_name));
        }
        let ticket = self.journal_append(&Record::Account(account.clone()))?;
        accounts.insert(account.user_name.clone(), account);
        drop(accounts);
        self.journal_wait(ticket)
    }

    /// The role of an account, when it exists.
    pub fn account_role(&self, user_name: &str) -> Option<AccountRole> {
        lock(&self.accounts)
            .get(user_name)
            .map(|account| account.role)
    }

    /// Deletes an account and revokes its API keys.
    pub fn delete_account(&self, user_name: &str) -> ManagerResult<()> {
        let mut accounts = lock(&self.accounts);
        if !accounts.contains_key(user_name) {
            return Err(ManagerError::NotFound(format!(
                "account {user_name:?} does not exist"
            )));
        }
        // Accounts are locked before keys, as in `create_api_key`.
        self.revoke_keys_of(user_name)?;
        let ticket = self.journal_append(&Record::AccountRemoved(user_name.to_string()))?;
        accounts.remove(user_name);
        drop(accounts);
        self.journal_wait(ticket)
    }

    /// Every account, by name.
    pub fn list_accounts(&self) -> Vec<Account> {
        lock(&self.accounts).values().cloned().collect()
    }
}
