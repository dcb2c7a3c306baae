//! The schema-v1 line of a [`Record`], written by the log's thread.

use kvcm_optimizer::trace::events::{Event, EventType};

use super::record::{event, key_bits, Record};

/// The JSON line of a record.
pub fn line_of(record: Record) -> Vec<u8> {
    // An `Event` holds only strings and numbers: serialising it cannot fail.
    serde_json::to_vec(&event_of(record)).unwrap_or_default()
}

/// The schema-v1 event of a record.
fn event_of(record: Record) -> Event {
    match record {
        Record::Lookup {
            ts_us,
            instance,
            keys,
            block_tokens,
            input_tokens,
        } => {
            let keys = keys.into_iter().map(key_bits).collect();
            let mut line = event(EventType::GetCacheLocation, ts_us, &instance, keys);
            line.block_tokens = Some(block_tokens);
            line.input_tokens = input_tokens;
            line
        }
        Record::WriteStarted {
            ts_us,
            instance,
            keys,
            session,
        } => {
            let keys: Vec<u64> = keys.into_iter().map(key_bits).collect();
            let mut line = event(EventType::StartWriteCache, ts_us, &instance, keys);
            line.write_session = Some(session);
            line
        }
        Record::WriteFinished {
            ts_us,
            instance,
            session,
            keys,
        } => {
            let keys = keys.into_iter().map(key_bits).collect();
            let mut line = event(EventType::FinishWriteCache, ts_us, &instance, keys);
            line.write_session = Some(session);
            line
        }
        Record::Reclaimed {
            ts_us,
            instance,
            keys,
        } => event(
            EventType::Reclaim,
            ts_us,
            &instance,
            keys.into_iter().map(key_bits).collect(),
        ),
    }
}
