//! Protobuf values in the schema registry's wire format, decoded for the Spark export.
//!
//! Three entry points, so that no Python runs per record:
//!
//! - `protobuf_compile`: a registered schema (`.proto` text, or a base64 `FileDescriptorProto` as
//!   confluent-kafka's serializer registers it) and the schemas it imports (its registry references) into
//!   a serialized `FileDescriptorSet` (protox, a protobuf compiler in Rust; the well-known types built in);
//! - `protobuf_json_schema`: the JSON Schema of one message type's JSON form, which the export turns into
//!   Spark columns as it does a JSON Schema subject's (`reader/spark/registry_json.py`);
//! - `ProtobufDecoder`: a column of framed values (Arrow buffers) into a column of JSON texts, the proto3
//!   JSON mapping with the fields' proto names, 64-bit integers as numbers and default values written
//!   (prost-reflect), parsed afterwards by Spark's compiled `from_json`. A value that is not framed, names
//!   an unknown schema id or another message type, or does not decode is null (the export's `_corrupt`).
//!
//! The framing (Confluent's): magic byte 0, the schema id (big-endian int32), the message indexes (a
//! zigzag varint count, then that many zigzag varints: the path of the message type through the file's
//! messages and their nested ones; a count of 0 means `[0]`, the file's first message), the message.

use std::collections::HashMap;

use base64::Engine;
use prost_reflect::{DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, SerializeOptions};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde_json::{json, Map, Value};

use crate::with_buffer;

/// The name the main schema is compiled under when it is `.proto` text (a descriptor keeps its own).
const MAIN: &str = "registered_schema.proto";

struct Registered {
    files: HashMap<String, File>,
}

impl FileResolver for Registered {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        self.files.get(name).cloned().ok_or_else(|| protox::Error::file_not_found(name))
    }
}

/// A schema's text as a protox file: `.proto` source, else a base64 `FileDescriptorProto`.
fn registered_file(name: &str, text: &str) -> Result<File, String> {
    let source_error = match File::from_source(name, text) {
        Ok(file) => return Ok(file),
        Err(error) => error,
    };
    let descriptor = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()
        .and_then(|bytes| File::decode_file_descriptor_proto(bytes.as_slice()).ok());
    match descriptor {
        Some(file) => Ok(file),
        None => Err(format!("{name} is neither .proto text nor a base64 FileDescriptorProto: {source_error}")),
    }
}

/// ``schema`` (with ``imports``: import name -> schema text) compiled: (the serialized FileDescriptorSet,
/// imports first, and the main file's name in it). Raises ValueError naming the file and line at fault.
#[pyfunction]
pub fn protobuf_compile<'py>(
    py: Python<'py>,
    schema: &str,
    imports: HashMap<String, String>,
) -> PyResult<(Bound<'py, PyBytes>, String)> {
    let mut files = HashMap::new();
    for (name, text) in &imports {
        files.insert(name.clone(), registered_file(name, text).map_err(PyValueError::new_err)?);
    }
    let main = registered_file(MAIN, schema).map_err(PyValueError::new_err)?;
    let main_name = if main.name().is_empty() { MAIN.to_string() } else { main.name().to_string() };
    files.insert(main_name.clone(), main);
    let mut chain = ChainFileResolver::new();
    chain.add(Registered { files });
    chain.add(GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(chain);
    compiler.include_imports(true);
    compiler.open_file(&main_name).map_err(|e| PyValueError::new_err(format!("protobuf schema: {e}")))?;
    Ok((PyBytes::new(py, &compiler.encode_file_descriptor_set()), main_name))
}

fn pool_and_file(descriptor_set: &[u8], file: &str) -> PyResult<(DescriptorPool, prost_reflect::FileDescriptor)> {
    let pool = DescriptorPool::decode(descriptor_set)
        .map_err(|e| PyValueError::new_err(format!("not a FileDescriptorSet: {e}")))?;
    let main = pool
        .get_file_by_name(file)
        .ok_or_else(|| PyValueError::new_err(format!("the descriptor set has no file {file}")))?;
    Ok((pool, main))
}

/// The message type ``message`` names (a full name, or a name of the main file's), else the main file's
/// first message: (its full name, the JSON Schema of its JSON form).
#[pyfunction]
#[pyo3(signature = (descriptor_set, file, message=None))]
pub fn protobuf_json_schema(descriptor_set: &[u8], file: &str, message: Option<&str>) -> PyResult<(String, String)> {
    let (pool, main) = pool_and_file(descriptor_set, file)?;
    let target = match message {
        Some(name) => pool.get_message_by_name(name).or_else(|| {
            let qualified = format!("{}.{name}", main.package_name());
            pool.get_message_by_name(&qualified)
        }),
        None => main.messages().next(),
    }
    .ok_or_else(|| match message {
        Some(name) => PyValueError::new_err(format!("the schema has no message type {name}")),
        None => PyValueError::new_err("the schema declares no message type"),
    })?;
    let mut defs = Map::new();
    let root = message_schema(&target, &mut defs);
    let document = json!({"$defs": Value::Object(defs), "$ref": root["$ref"].clone()});
    Ok((target.full_name().to_string(), document.to_string()))
}

/// A message type as a reference into ``defs`` (filled on first use, so recursion ends in a reference to
/// itself), or the JSON form of a well-known type.
fn message_schema(message: &MessageDescriptor, defs: &mut Map<String, Value>) -> Value {
    if let Some(known) = well_known(message.full_name()) {
        return known;
    }
    let name = message.full_name().to_string();
    if !defs.contains_key(&name) {
        defs.insert(name.clone(), Value::Null);
        let mut properties = Map::new();
        for field in message.fields() {
            properties.insert(field.name().to_string(), field_schema(&field, defs));
        }
        defs.insert(name.clone(), json!({"type": "object", "properties": properties}));
    }
    json!({"$ref": format!("#/$defs/{name}")})
}

fn field_schema(field: &FieldDescriptor, defs: &mut Map<String, Value>) -> Value {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else { unreachable!("a map field's kind is its entry message") };
        return json!({"type": "object", "additionalProperties": kind_schema(&entry.map_entry_value_field().kind(), defs)});
    }
    let value = kind_schema(&field.kind(), defs);
    if field.is_list() {
        json!({"type": "array", "items": value})
    } else {
        value
    }
}

fn kind_schema(kind: &Kind, defs: &mut Map<String, Value>) -> Value {
    match kind {
        Kind::Double | Kind::Float => json!({"type": "number"}),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 | Kind::Uint32 | Kind::Fixed32 => json!({"type": "integer"}),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint64 | Kind::Fixed64 => json!({"type": "integer"}),
        Kind::Bool => json!({"type": "boolean"}),
        Kind::String => json!({"type": "string"}),
        Kind::Bytes => json!({"type": "string", "contentEncoding": "base64"}),
        Kind::Enum(_) => json!({"type": "string"}), // the value's name (its number when it has none)
        Kind::Message(message) => message_schema(message, defs),
    }
}

/// The JSON forms the proto3 mapping gives the well-known types: a timestamp as RFC 3339 text, the
/// wrappers as their value; Struct, Value, ListValue and Any as any JSON (kept as JSON text).
fn well_known(full_name: &str) -> Option<Value> {
    Some(match full_name {
        "google.protobuf.Timestamp" => json!({"type": "string", "format": "date-time"}),
        "google.protobuf.Duration" | "google.protobuf.FieldMask" => json!({"type": "string"}),
        "google.protobuf.Struct" | "google.protobuf.Value" | "google.protobuf.ListValue" | "google.protobuf.Any" => {
            json!({})
        }
        "google.protobuf.Empty" => json!({"type": "object"}),
        "google.protobuf.DoubleValue" | "google.protobuf.FloatValue" => json!({"type": "number"}),
        "google.protobuf.Int64Value"
        | "google.protobuf.UInt64Value"
        | "google.protobuf.Int32Value"
        | "google.protobuf.UInt32Value" => json!({"type": "integer"}),
        "google.protobuf.BoolValue" => json!({"type": "boolean"}),
        "google.protobuf.StringValue" => json!({"type": "string"}),
        "google.protobuf.BytesValue" => json!({"type": "string", "contentEncoding": "base64"}),
        _ => return None,
    })
}

/// Framed values of the schema ids given into JSON texts of one message type.
#[pyclass(module = "tiering_native")]
pub struct ProtobufDecoder {
    files: HashMap<u32, prost_reflect::FileDescriptor>,
    message: String,
}

#[pymethods]
impl ProtobufDecoder {
    /// ``schemas``: schema id -> (its FileDescriptorSet from `protobuf_compile`, the main file's name);
    /// ``message``: the full name of the message type the values are of.
    #[new]
    fn new(schemas: HashMap<u32, (Vec<u8>, String)>, message: String) -> PyResult<Self> {
        let mut files = HashMap::new();
        for (id, (set, file)) in schemas {
            files.insert(id, pool_and_file(&set, &file)?.1);
        }
        Ok(ProtobufDecoder { files, message })
    }

    /// The JSON texts of ``length`` values from ``offset`` of an Arrow binary array given by its buffers
    /// (``validity``: None when no value is null): the buffers of an Arrow string array (int32 offsets,
    /// data, validity bitmap) and its null count. The GIL is released for the walk.
    #[pyo3(signature = (offsets, data, validity, offset, length))]
    fn to_json<'py>(
        &self,
        py: Python<'py>,
        offsets: &Bound<'py, PyAny>,
        data: &Bound<'py, PyAny>,
        validity: Option<&Bound<'py, PyAny>>,
        offset: usize,
        length: usize,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>, usize)> {
        let bitmap = match validity {
            Some(buffer) => Some(with_buffer(buffer, |b| b.to_vec())?),
            None => None,
        };
        let walked = with_buffer(offsets, |offsets| {
            with_buffer(data, |data| py.detach(|| self.walk(offsets, data, bitmap.as_deref(), offset, length)))
        })???;
        let (out_offsets, out_data, out_validity, nulls) = walked;
        Ok((PyBytes::new(py, &out_offsets), PyBytes::new(py, &out_data), PyBytes::new(py, &out_validity), nulls))
    }
}

type Walked = (Vec<u8>, Vec<u8>, Vec<u8>, usize);

impl ProtobufDecoder {
    fn walk(&self, offsets: &[u8], data: &[u8], validity: Option<&[u8]>, offset: usize, length: usize) -> PyResult<Walked> {
        if offsets.len() < (offset + length + 1) * 4 {
            return Err(PyValueError::new_err("the offsets buffer is shorter than the array"));
        }
        let at = |i: usize| i32::from_le_bytes(offsets[i * 4..i * 4 + 4].try_into().unwrap()) as usize;
        let options = SerializeOptions::new()
            .stringify_64_bit_integers(false)
            .use_proto_field_name(true)
            .skip_default_fields(false);
        let mut out_offsets = Vec::with_capacity((length + 1) * 4);
        let mut out_data = Vec::new();
        let mut out_validity = vec![0u8; length.div_ceil(8)];
        let mut nulls = 0;
        out_offsets.extend_from_slice(&0i32.to_le_bytes());
        for i in 0..length {
            let row = offset + i;
            let present = validity.is_none_or(|bits| bits[row / 8] & (1 << (row % 8)) != 0);
            let (start, end) = (at(row), at(row + 1));
            if present && start <= end && end <= data.len() && self.json(&data[start..end], &options, &mut out_data) {
                out_validity[i / 8] |= 1 << (i % 8);
            } else {
                nulls += 1;
            }
            let written = i32::try_from(out_data.len())
                .map_err(|_| PyValueError::new_err("more than 2 GiB of JSON text in one Arrow batch"))?;
            out_offsets.extend_from_slice(&written.to_le_bytes());
        }
        Ok((out_offsets, out_data, out_validity, nulls))
    }

    /// Appends the JSON text of one framed value to ``out``; false (``out`` unchanged) when it gives none.
    fn json(&self, value: &[u8], options: &SerializeOptions, out: &mut Vec<u8>) -> bool {
        if value.len() < 5 || value[0] != 0 {
            return false;
        }
        let id = u32::from_be_bytes(value[1..5].try_into().unwrap());
        let Some(file) = self.files.get(&id) else { return false };
        let mut rest = &value[5..];
        let Some(message) = indexed_message(file, &mut rest) else { return false };
        if message.full_name() != self.message {
            return false;
        }
        let Ok(decoded) = DynamicMessage::decode(message, rest) else { return false };
        let mark = out.len();
        let mut serializer = serde_json::Serializer::new(&mut *out);
        if decoded.serialize_with_options(&mut serializer, options).is_err() {
            out.truncate(mark);
            return false;
        }
        true
    }
}

/// The message type the indexes at the start of ``rest`` name (``rest`` moved past them).
fn indexed_message(file: &prost_reflect::FileDescriptor, rest: &mut &[u8]) -> Option<MessageDescriptor> {
    let count = zigzag(rest)?;
    if count == 0 {
        return file.messages().next();
    }
    if !(1..=128).contains(&count) {
        return None;
    }
    let mut message = file.messages().nth(usize::try_from(zigzag(rest)?).ok()?)?;
    for _ in 1..count {
        let index = usize::try_from(zigzag(rest)?).ok()?;
        let child = message.child_messages().nth(index)?;
        message = child;
    }
    Some(message)
}

fn zigzag(rest: &mut &[u8]) -> Option<i64> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&byte, tail) = rest.split_first()?;
        *rest = tail;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    None
}
