//! The one Lua script every write runs: check what a read-modify-write read, enforce the key
//! cap, apply puts and deletes to the value HASH and the order ZSET together.
//!
//! Invariants (Redis runs a script atomically, and its keys share one hash tag, so one slot):
//! - with a fencing token, if the namespace's fence key holds a greater token (a newer
//!   leader wrote), the script changes nothing and answers `+FENCED`; a write that applies
//!   raises the fence to its token, so once a newer leader wrote, every write of an older
//!   one is refused;
//! - if any checked field no longer holds the bytes that were read (absent = absent), the
//!   script changes nothing and answers `+CONFLICT`;
//! - if the cap is set and the batch grows the hash past it (`HLEN + growth > cap` with a
//!   positive growth), it changes nothing and answers `+FULL`;
//! - otherwise every put is an `HSET` and every delete `HDEL` + `ZREM`; a put whose key may be
//!   new is also `ZADD 0`, so the hash's fields and the zset's members stay the same set; it
//!   answers the number of deleted fields that were present.
//!
//! The fields of `puts` and `deletes` are distinct (the caller merges duplicates). The growth
//! is `known_growth` (keys whose presence a check of this script proves) plus the number of
//! `uncertain` fields that are absent. Sections are laid out so that each variadic call
//! unpacks `ARGV` directly, in chunks below Lua's `unpack` limit.

use super::resp::{Command, Reply};

/// The script. `KEYS`: values hash, order zset, and for a fenced write the fence. `ARGV`: cap (`""` = none), known
/// growth, then the counts of: present checks, absent checks, uncertain fields, puts, new
/// members, deletes; the fencing token (`""` = none); then the sections: present
/// check fields, their expected values, absent check fields, uncertain fields, put
/// field/value pairs, `0`/member pairs, delete fields.
pub const WRITE: &str = r#"
local h, z = KEYS[1], KEYS[2]
local cap, grow = tonumber(ARGV[1]), tonumber(ARGV[2])
local npres, nabs, nunk = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local nput, nnew, ndel = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local token = tonumber(ARGV[9])
if token and token < tonumber(redis.call('GET', KEYS[3]) or '0') then
  return redis.status_reply('FENCED')
end
local CHUNK = 1000
local function each(first, n, step, call)
  for s = first, first + n - 1, CHUNK * step do
    call(s, math.min(s + CHUNK * step - 1, first + n - 1))
  end
end
local function hmget(first, n)
  if n == 0 then return {} end
  if n <= CHUNK then return redis.call('HMGET', h, unpack(ARGV, first, first + n - 1)) end
  local out = {}
  each(first, n, 1, function(s, e)
    local got = redis.call('HMGET', h, unpack(ARGV, s, e))
    for i = 1, #got do out[#out + 1] = got[i] end
  end)
  return out
end
local p = 10
local cur = hmget(p, npres)
for i = 1, npres do
  if cur[i] ~= ARGV[p + npres + i - 1] then return redis.status_reply('CONFLICT') end
end
p = p + 2 * npres
cur = hmget(p, nabs)
for i = 1, nabs do
  if cur[i] then return redis.status_reply('CONFLICT') end
end
p = p + nabs
if cap then
  cur = hmget(p, nunk)
  for i = 1, nunk do if not cur[i] then grow = grow + 1 end end
  if grow > 0 and redis.call('HLEN', h) + grow > cap then
    return redis.status_reply('FULL')
  end
end
p = p + nunk
if token then redis.call('SET', KEYS[3], ARGV[9]) end
each(p, 2 * nput, 2, function(s, e) redis.call('HSET', h, unpack(ARGV, s, e)) end)
p = p + 2 * nput
each(p, 2 * nnew, 2, function(s, e) redis.call('ZADD', z, unpack(ARGV, s, e)) end)
p = p + 2 * nnew
local removed = 0
each(p, ndel, 1, function(s, e)
  removed = removed + redis.call('HDEL', h, unpack(ARGV, s, e))
  redis.call('ZREM', z, unpack(ARGV, s, e))
end)
return removed
"#;

/// Raises a namespace's fence to a token, or refuses as `+FENCED` when a greater one is
/// there. `KEYS`: the fence; `ARGV`: the token.
pub const FENCE: &str = r#"
if tonumber(ARGV[1]) < tonumber(redis.call('GET', KEYS[1]) or '0') then
  return redis.status_reply('FENCED')
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"#;

/// Removes a namespace's hash and zset (`UNLINK`: freed in the background) after the fence
/// check of [`FENCE`], which it raises; the fence key stays. `KEYS`: fence, hash, zset;
/// `ARGV`: the token.
pub const DROP: &str = r#"
if tonumber(ARGV[1]) < tonumber(redis.call('GET', KEYS[1]) or '0') then
  return redis.status_reply('FENCED')
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('UNLINK', KEYS[2], KEYS[3])
return 1
"#;

/// One write: the checks of a read-modify-write and the changes to apply.
#[derive(Debug, Default)]
pub struct WriteBatch {
    /// Fields that must still hold these bytes.
    pub expect_present: Vec<([u8; 8], Vec<u8>)>,
    /// Fields that must still be absent.
    pub expect_absent: Vec<[u8; 8]>,
    /// Growth of the hash from keys whose presence the checks prove.
    pub known_growth: i64,
    /// Fields to put whose presence no check proves (counted for the cap when one is set).
    pub uncertain: Vec<[u8; 8]>,
    /// Fields to set (distinct).
    pub puts: Vec<([u8; 8], Vec<u8>)>,
    /// Fields that may be new in the hash: added to the zset.
    pub new_members: Vec<[u8; 8]>,
    /// Fields to remove (distinct, none also in `puts`).
    pub deletes: Vec<[u8; 8]>,
}

/// What the script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Applied; this many deleted fields were present.
    Applied(u64),
    /// A checked field changed since it was read: nothing applied.
    Conflict,
    /// The key cap would be passed: nothing applied.
    Full,
}

impl WriteBatch {
    /// True when the batch changes nothing.
    pub fn is_noop(&self) -> bool {
        self.puts.is_empty() && self.deletes.is_empty()
    }

    /// `EVALSHA <sha>` (or `EVAL <script>` when `by_sha` is false) of this batch on the keys.
    pub fn command(
        &self,
        by_sha: Option<&str>,
        keys: [&str; 3],
        cap: u64,
        fence: Option<u64>,
    ) -> Command {
        let mut command = match by_sha {
            Some(sha) => {
                let mut command = Command::new("EVALSHA");
                command.arg(sha);
                command
            }
            None => {
                let mut command = Command::new("EVAL");
                command.arg(WRITE);
                command
            }
        };
        // The fence key is declared (and touched) only by fenced writes: an unfenced write
        // names only keys that exist, which a slot migration moves without TRYAGAIN loops.
        match fence {
            Some(_) => command.arg("3").arg(keys[0]).arg(keys[1]).arg(keys[2]),
            None => command.arg("2").arg(keys[0]).arg(keys[1]),
        };
        let cap = if cap == u64::MAX {
            String::new()
        } else {
            cap.to_string()
        };
        command.arg(cap).arg(self.known_growth.to_string());
        for count in [
            self.expect_present.len(),
            self.expect_absent.len(),
            self.uncertain.len(),
            self.puts.len(),
            self.new_members.len(),
            self.deletes.len(),
        ] {
            command.arg(count.to_string());
        }
        command.arg(fence.map_or(String::new(), |token| token.to_string()));
        self.add_sections(&mut command);
        command
    }

    fn add_sections(&self, command: &mut Command) {
        for (field, _) in &self.expect_present {
            command.arg(field);
        }
        for (_, value) in &self.expect_present {
            command.arg(value);
        }
        for field in self.expect_absent.iter().chain(&self.uncertain) {
            command.arg(field);
        }
        for (field, value) in &self.puts {
            command.arg(field).arg(value);
        }
        for field in &self.new_members {
            command.arg("0").arg(field);
        }
        for field in &self.deletes {
            command.arg(field);
        }
    }
}

/// The script's status reply when a newer leader's token fenced the write.
pub const FENCED: &str = "FENCED";

/// Reads the script's reply (not [`FENCED`]); `Err` carries a description of an unexpected
/// one.
pub fn outcome(reply: &Reply) -> Result<Outcome, String> {
    match reply {
        Reply::Int(removed) if *removed >= 0 => Ok(Outcome::Applied(*removed as u64)),
        Reply::Status(status) if status == "CONFLICT" => Ok(Outcome::Conflict),
        Reply::Status(status) if status == "FULL" => Ok(Outcome::Full),
        other => Err(format!("the write script answered {other:?}")),
    }
}
