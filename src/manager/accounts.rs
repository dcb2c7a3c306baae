//! Accounts (stored, listed; not used for authentication in this issue).

use super::error::{invalid, ManagerError, ManagerResult};
use super::Manager;
use crate::proto::admin;
use crate::sync::lock;

/// One account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Unique user name.
    pub user_name: String,
    /// Password as given (the reference stores it in clear; never returned).
    pub password: String,
    /// Wire role number (`AccountRole`).
    pub role: i32,
}

impl Manager {
    /// Adds an account; an existing name is an error.
    pub fn add_account(&self, account: Account) -> ManagerResult<()> {
        if account.user_name.is_empty() {
            return Err(invalid("AddAccount", "user_name"));
        }
        if admin::AccountRole::try_from(account.role).is_err() {
            return Err(invalid("AddAccount", "role"));
        }
        let mut accounts = lock(&self.accounts);
        if accounts.contains_key(&account.user_name) {
            return Err(ManagerError::AlreadyExists(format!(
                "account {:?} already exists",
                account.user_name
            )));
        }
        accounts.insert(account.user_name.clone(), account);
        Ok(())
    }

    /// Deletes an account.
    pub fn delete_account(&self, user_name: &str) -> ManagerResult<()> {
        lock(&self.accounts)
            .remove(user_name)
            .map(drop)
            .ok_or_else(|| ManagerError::NotFound(format!("account {user_name:?} does not exist")))
    }

    /// Every account, by name.
    pub fn list_accounts(&self) -> Vec<Account> {
        lock(&self.accounts).values().cloned().collect()
    }
}
