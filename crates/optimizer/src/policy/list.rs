//! [`Lists`]: intrusive doubly linked lists over block ids sharing one node arena.
//!
//! A block is in at most one of the lists at a time. Lists are numbered from 0; their count
//! grows on demand. Front = most recently pushed, back =
//! oldest. All operations are O(1); tables grow on demand.

use super::{grow, BlockId};

const NIL: BlockId = BlockId::MAX;
const NOWHERE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Ends {
    front: BlockId,
    back: BlockId,
    len: usize,
}

const EMPTY: Ends = Ends {
    front: NIL,
    back: NIL,
    len: 0,
};

/// Linked lists of blocks.
#[derive(Debug)]
pub(crate) struct Lists {
    newer: Vec<BlockId>,
    older: Vec<BlockId>,
    owner: Vec<u32>,
    ends: Vec<Ends>,
}

impl Lists {
    /// `count` empty lists (more appear when a block is pushed to a higher list number).
    pub(crate) fn new(count: usize) -> Self {
        Lists {
            newer: Vec::new(),
            older: Vec::new(),
            owner: Vec::new(),
            ends: vec![EMPTY; count],
        }
    }

    /// The list holding `block`, if any.
    pub(crate) fn which(&self, block: BlockId) -> Option<usize> {
        match self.owner.get(block as usize) {
            Some(&owner) if owner != NOWHERE => Some(owner as usize),
            _ => None,
        }
    }

    /// Length of list `list`.
    pub(crate) fn len(&self, list: usize) -> usize {
        self.ends.get(list).map_or(0, |ends| ends.len)
    }

    /// The oldest block of list `list`.
    pub(crate) fn back(&self, list: usize) -> Option<BlockId> {
        let back = self.ends.get(list)?.back;
        (back != NIL).then_some(back)
    }

    /// The next newer block after `block` in its list (toward the front).
    pub(crate) fn newer(&self, block: BlockId) -> Option<BlockId> {
        let newer = self.newer[block as usize];
        (newer != NIL).then_some(newer)
    }

    /// Pushes `block` (which must be in no list) to the front of `list`.
    pub(crate) fn push_front(&mut self, list: usize, block: BlockId) {
        grow(&mut self.newer, block, NIL);
        grow(&mut self.older, block, NIL);
        grow(&mut self.owner, block, NOWHERE);
        if self.ends.len() <= list {
            self.ends.resize(list + 1, EMPTY);
        }
        let old_front = self.ends[list].front;
        self.newer[block as usize] = NIL;
        self.older[block as usize] = old_front;
        if old_front == NIL {
            self.ends[list].back = block;
        } else {
            self.newer[old_front as usize] = block;
        }
        self.ends[list].front = block;
        self.ends[list].len += 1;
        self.owner[block as usize] = list as u32;
    }

    /// Unlinks `block` from whichever list holds it; returns that list.
    pub(crate) fn remove(&mut self, block: BlockId) -> Option<usize> {
        let list = self.which(block)?;
        let (newer, older) = (self.newer[block as usize], self.older[block as usize]);
        match newer {
            NIL => self.ends[list].front = older,
            newer => self.older[newer as usize] = older,
        }
        match older {
            NIL => self.ends[list].back = newer,
            older => self.newer[older as usize] = newer,
        }
        self.ends[list].len -= 1;
        self.owner[block as usize] = NOWHERE;
        Some(list)
    }

    /// Removes and returns the oldest block of `list`.
    pub(crate) fn pop_back(&mut self, list: usize) -> Option<BlockId> {
        let back = self.back(list)?;
        self.remove(back);
        Some(back)
    }

    /// Moves `block` to the front of `list` (from wherever it was).
    pub(crate) fn move_to_front(&mut self, list: usize, block: BlockId) {
        self.remove(block);
        self.push_front(list, block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(lists: &mut Lists, list: usize) -> Vec<BlockId> {
        std::iter::from_fn(|| lists.pop_back(list)).collect()
    }

    #[test]
    fn lists_keep_order_and_membership() {
        let mut lists = Lists::new(1);
        for block in [5, 1, 9] {
            lists.push_front(0, block);
        }
        // List 1 is created on its first push.
        assert_eq!(lists.len(1), 0);
        lists.push_front(1, 7);
        lists.move_to_front(0, 5);
        lists.move_to_front(1, 1);
        assert_eq!(lists.which(9), Some(0));
        assert_eq!(lists.which(1), Some(1));
        assert_eq!(lists.which(100), None);
        assert_eq!(lists.newer(9), Some(5));
        assert_eq!(lists.len(0), 2);
        assert_eq!(drain(&mut lists, 0), vec![9, 5]);
        assert_eq!(drain(&mut lists, 1), vec![7, 1]);
        assert_eq!(lists.which(5), None);
    }
}
