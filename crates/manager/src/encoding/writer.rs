//! Appends the primitive items of the storage encoding.

/// An encoding being written.
#[derive(Debug, Default)]
pub struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    /// The bytes written.
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }

    /// Raw bytes.
    pub fn bytes(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    /// Length-prefixed raw bytes (a nested encoding).
    pub fn blob(&mut self, bytes: &[u8]) {
        self.len(bytes.len());
        self.bytes(bytes);
    }

    /// Little endian.
    pub fn u64(&mut self, value: u64) {
        self.bytes(&value.to_le_bytes());
    }

    /// One byte.
    pub fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }

    /// A boolean as one byte.
    pub fn bool(&mut self, value: bool) {
        self.u8(u8::from(value));
    }

    /// Little endian.
    pub fn u16(&mut self, value: u16) {
        self.bytes(&value.to_le_bytes());
    }

    /// Little endian.
    pub fn u32(&mut self, value: u32) {
        self.bytes(&value.to_le_bytes());
    }

    /// Little endian.
    pub fn i32(&mut self, value: i32) {
        self.bytes(&value.to_le_bytes());
    }

    /// Little endian.
    pub fn i64(&mut self, value: i64) {
        self.bytes(&value.to_le_bytes());
    }

    /// IEEE 754 bits, little endian.
    pub fn f64(&mut self, value: f64) {
        self.bytes(&value.to_bits().to_le_bytes());
    }

    /// A list length (lists longer than `u32::MAX` cannot exist in the manager's objects).
    pub fn len(&mut self, len: usize) {
        self.u32(u32::try_from(len).unwrap_or(u32::MAX));
    }

    /// A length-prefixed UTF-8 string.
    pub fn str(&mut self, value: &str) {
        self.len(value.len());
        self.bytes(value.as_bytes());
    }

    /// A length-prefixed list.
    pub fn list<T>(&mut self, items: &[T], mut item: impl FnMut(&mut Self, &T)) {
        self.len(items.len());
        for value in items {
            item(self, value);
        }
    }

    /// An optional value.
    pub fn option<T>(&mut self, value: Option<&T>, item: impl FnOnce(&mut Self, &T)) {
        match value {
            None => self.u8(0),
            Some(value) => {
                self.u8(1);
                item(self, value);
            }
        }
    }
}
