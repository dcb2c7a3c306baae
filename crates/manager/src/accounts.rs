//! Accounts (stored, listed; not used for authentication yet).

use super::error::{ManagerError, ManagerResult};
use super::journal::Record;
use super::Manager;
use crate::sync::lock;

/// What an account may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountRole {
    /// An ordinary user.
    User,
    /// An administrator.
    Admin,
}

/// One account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Unique user name.
    pub user_name: String,
    /// Password as given (the reference stores it in clear; never returned).
    pub password: String,
    /// Its role.
    pub role: AccountRole,
}

impl Manager {
    /// Adds an account; an existing name is an error.
    pub fn add_account(&self, account: Account) -> ManagerResult<()> {
        if account.user_name.is_empty() {
            return Err(ManagerError::invalid("user_name"));
        }
        let mut accounts = lock(&self.accounts);
        if accounts.contains_key(&account.user_name) {
            return Err(ManagerError::AlreadyExists(format!(
                "account {:?} already exists",
                account.user_name
            )));
        }
        let ticket = self.journal_append(&Record::Account(account.clone()))?;
        accounts.insert(account.user_name.clone(), account);
        drop(accounts);
        self.journal_wait(ticket)
    }

    /// Deletes an account.
    pub fn delete_account(&self, user_name: &str) -> ManagerResult<()> {
        let mut accounts = lock(&self.accounts);
        if !accounts.contains_key(user_name) {
            return Err(ManagerError::NotFound(format!(
                "account {user_name:?} does not exist"
            )));
        }
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
