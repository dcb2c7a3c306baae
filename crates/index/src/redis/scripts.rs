//! The one Lua script every write runs: check what a read-modify-write read, enforce the key
//! cap, apply puts and deletes to the value HASH and the order ZSET together.
//!
//! Invariants (Redis runs a script atomically, and both keys share one hash tag, so one slot):
//! - if any checked field no longer holds the bytes that were read (absent = absent), the
//!   script changes nothing and answers `+CONFLICT`;
//! - if the cap is set and `HLEN + added − removed > cap` with a net growth, it changes
//!   nothing and answers `+FULL`;
//! - otherwise every put is `HSET` + `ZADD 0` and every delete `HDEL` + `ZREM`, so the hash's
//!   fields and the zset's members stay the same set; it answers the number of deleted fields
//!   that were present.
//!
//! The fields of `puts` and `deletes` are distinct (the caller merges duplicates), so growth
//! is counted once per key. Variadic calls go in chunks below Lua's `unpack` limit.

use super::resp::{Command, Reply};

/// The script. `ARGV`: cap (`""` = none), #present checks, #absent checks, #puts, #deletes,
/// then the present-check fields, their expected values, the absent-check fields, the put
/// fields, the put values, the delete fields.
pub const WRITE: &str = r#"
local h, z = KEYS[1], KEYS[2]
local cap = tonumber(ARGV[1])
local npres, nabs = tonumber(ARGV[2]), tonumber(ARGV[3])
local nput, ndel = tonumber(ARGV[4]), tonumber(ARGV[5])
local CHUNK = 1000
local function hmget(first, n)
  local out = {}
  for s = first, first + n - 1, CHUNK do
    local got = redis.call('HMGET', h, unpack(ARGV, s, math.min(s + CHUNK - 1, first + n - 1)))
    for i = 1, #got do out[#out + 1] = got[i] end
  end
  return out
end
local p = 6
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
local put_f, put_v, del_f = p, p + nput, p + 2 * nput
if cap then
  local grow = 0
  cur = hmget(put_f, nput)
  for i = 1, nput do if not cur[i] then grow = grow + 1 end end
  cur = hmget(del_f, ndel)
  for i = 1, ndel do if cur[i] then grow = grow - 1 end end
  if grow > 0 and redis.call('HLEN', h) + grow > cap then
    return redis.status_reply('FULL')
  end
end
for s = 0, nput - 1, CHUNK do
  local hargs, zargs = {}, {}
  for i = s, math.min(s + CHUNK, nput) - 1 do
    hargs[#hargs + 1] = ARGV[put_f + i]
    hargs[#hargs + 1] = ARGV[put_v + i]
    zargs[#zargs + 1] = '0'
    zargs[#zargs + 1] = ARGV[put_f + i]
  end
  redis.call('HSET', h, unpack(hargs))
  redis.call('ZADD', z, unpack(zargs))
end
local removed = 0
for s = del_f, del_f + ndel - 1, CHUNK do
  local e = math.min(s + CHUNK - 1, del_f + ndel - 1)
  removed = removed + redis.call('HDEL', h, unpack(ARGV, s, e))
  redis.call('ZREM', z, unpack(ARGV, s, e))
end
return removed
"#;

/// One write: the checks of a read-modify-write and the changes to apply.
#[derive(Debug, Default)]
pub struct WriteBatch {
    /// Fields that must still hold these bytes.
    pub expect_present: Vec<([u8; 8], Vec<u8>)>,
    /// Fields that must still be absent.
    pub expect_absent: Vec<[u8; 8]>,
    /// Fields to set (distinct).
    pub puts: Vec<([u8; 8], Vec<u8>)>,
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
    pub fn command(&self, by_sha: Option<&str>, keys: [&str; 2], cap: u64) -> Command {
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
        command.arg("2").arg(keys[0]).arg(keys[1]);
        let cap = if cap == u64::MAX {
            String::new()
        } else {
            cap.to_string()
        };
        command.arg(cap);
        for count in [
            self.expect_present.len(),
            self.expect_absent.len(),
            self.puts.len(),
            self.deletes.len(),
        ] {
            command.arg(count.to_string());
        }
        let present = &self.expect_present;
        let fields = present.iter().map(|(f, _)| &f[..]);
        let values = present.iter().map(|(_, v)| &v[..]);
        let absent = self.expect_absent.iter().map(|f| &f[..]);
        let put_fields = self.puts.iter().map(|(f, _)| &f[..]);
        let put_values = self.puts.iter().map(|(_, v)| &v[..]);
        let deletes = self.deletes.iter().map(|f| &f[..]);
        let args = fields
            .chain(values)
            .chain(absent)
            .chain(put_fields)
            .chain(put_values)
            .chain(deletes);
        for arg in args {
            command.arg(arg);
        }
        command
    }
}

/// Reads the script's reply; `Err` carries a description of an unexpected one.
pub fn outcome(reply: &Reply) -> Result<Outcome, String> {
    match reply {
        Reply::Int(removed) if *removed >= 0 => Ok(Outcome::Applied(*removed as u64)),
        Reply::Status(status) if status == "CONFLICT" => Ok(Outcome::Conflict),
        Reply::Status(status) if status == "FULL" => Ok(Outcome::Full),
        other => Err(format!("the write script answered {other:?}")),
    }
}
