//! What every decoder and encoder shares: the error a malformed message gets ([`ProtoError`]), a
//! bounds-checked little-endian [`Reader`], the [`Put`] writer, and the `wire_struct!` macro that
//! declares a fixed wire struct with its field-by-field reader and writer.

/// Malformed input, with the offending value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// The command number is not one vfio-user defines.
    #[error("unknown vfio-user command {0}")]
    UnknownCommand(u16),
    /// A message ended before a field: `need` bytes at `offset`, `have` in all.
    #[error("message too short: {need} bytes needed at offset {offset}, {have} present")]
    Short {
        /// Where the field starts in the payload.
        offset: usize,
        /// Bytes the field needs.
        need: usize,
        /// Bytes the payload has.
        have: usize,
    },
    /// The header's size is smaller than the header or larger than allowed.
    #[error("message size {size} outside {min}..={max}")]
    BadSize {
        /// The size the header declares.
        size: u32,
        /// The least acceptable.
        min: u32,
        /// The most acceptable.
        max: u32,
    },
    /// A declared length disagrees with the bytes present.
    #[error("{what} is {declared}, but {present} bytes are present")]
    LengthMismatch {
        /// The field.
        what: &'static str,
        /// Its value.
        declared: u64,
        /// The bytes present.
        present: u64,
    },
}

/// A bounds-checked little-endian reader over a payload.
#[derive(Debug)]
pub struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// Reads `b` from its start.
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b, at: 0 }
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        let end = self.at.checked_add(n);
        let s = end
            .and_then(|e| self.b.get(self.at..e))
            .ok_or(ProtoError::Short {
                offset: self.at,
                need: n,
                have: self.b.len(),
            })?;
        self.at += n;
        Ok(s)
    }

    /// A `u16`.
    pub fn u16(&mut self) -> Result<u16, ProtoError> {
        let s = self.bytes(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    /// A `u32`.
    pub fn u32(&mut self) -> Result<u32, ProtoError> {
        let s = self.bytes(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    /// A `u64`.
    pub fn u64(&mut self) -> Result<u64, ProtoError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(a))
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = self.b.get(self.at..).unwrap_or(&[]);
        self.at = self.b.len();
        s
    }
}

/// Appends little-endian fields.
pub trait Put {
    /// Appends a `u16`.
    fn put16(&mut self, v: u16);
    /// Appends a `u32`.
    fn put32(&mut self, v: u32);
    /// Appends a `u64`.
    fn put64(&mut self, v: u64);
}

impl Put for Vec<u8> {
    fn put16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
}

/// A field of a fixed little-endian wire struct.
pub(super) trait Field: Sized {
    fn read(r: &mut Reader<'_>) -> Result<Self, ProtoError>;
    fn put(self, out: &mut Vec<u8>);
}

impl Field for u32 {
    fn read(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        r.u32()
    }
    fn put(self, out: &mut Vec<u8>) {
        out.put32(self);
    }
}

impl Field for u64 {
    fn read(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        r.u64()
    }
    fn put(self, out: &mut Vec<u8>) {
        out.put64(self);
    }
}

/// Declares a fixed little-endian wire struct: the fields in wire order, its encoded size `LEN`
/// (checked at compile time against the fields), and a private field-by-field reader and writer.
macro_rules! wire_struct {
    (
        $(#[$m:meta])*
        $name:ident, $len:expr, {
            $($(#[$fm:meta])* $f:ident: $t:ty),+ $(,)?
        }
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name {
            $($(#[$fm])* pub $f: $t),+
        }

        impl $name {
            /// Encoded size (of the fixed part).
            pub const LEN: usize = $len;

            fn read_fields(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
                Ok($name { $($f: Field::read(r)?),+ })
            }

            fn put_fields(self, out: &mut Vec<u8>) {
                $(Field::put(self.$f, out);)+
            }
        }

        const _: () = assert!($len == 0 $(+ std::mem::size_of::<$t>())+);
    };
}
pub(super) use wire_struct;

/// Decodes a fixed part and returns it with the bytes after it.
pub(super) fn with_rest<T>(
    p: &[u8],
    read: fn(&mut Reader<'_>) -> Result<T, ProtoError>,
) -> Result<(T, &[u8]), ProtoError> {
    let mut r = Reader::new(p);
    let fixed = read(&mut r)?;
    Ok((fixed, r.rest()))
}

/// Encodes a fixed part followed by `data`.
pub(super) fn then_data(len: usize, put: impl FnOnce(&mut Vec<u8>), data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + data.len());
    put(&mut v);
    v.extend_from_slice(data);
    v
}
