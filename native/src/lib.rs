//! Compiled hot paths of streamjoin. Each function has a pure-Python twin that gives the
//! same results (`streamjoin/partitioner.py`, `streamjoin/codecs.py`); property tests
//! compare the two.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};

const SEED: u32 = 0x9747_b28c;
const M: u32 = 0x5bd1_e995;
const R: u32 = 24;

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`): 4-byte
/// little-endian blocks, then the 1-3 trailing bytes, with Java's wrapping arithmetic.
fn murmur2_of(data: &[u8]) -> i32 {
    let length = data.len();
    let mut h: u32 = SEED ^ (length as u32);
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        // Java's fall-through switch: the trailing bytes XORed in little-endian order
        for (i, byte) in tail.iter().enumerate() {
            h ^= (*byte as u32) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// Kafka's murmur2 of `data`, as Java's signed 32-bit int.
#[pyfunction]
fn murmur2(data: &[u8]) -> i32 {
    murmur2_of(data)
}

/// `(murmur2(key) & 0x7fffffff) % num_partitions`: the partition Kafka's Java producer
/// picks for the serialized `key`.
#[pyfunction]
fn partition(key: &[u8], num_partitions: i64) -> PyResult<i64> {
    if num_partitions < 1 {
        return Err(PyValueError::new_err(format!(
            "num_partitions must be >= 1, got {num_partitions}"
        )));
    }
    let positive = (murmur2_of(key) & 0x7fff_ffff) as i64;
    Ok(positive % num_partitions)
}

/// A JSON scalar whose form msgspec writes byte for byte as Python's `json` encoder does:
/// exactly a str, int, bool or None (no subclass), or a float that both write in Python's
/// `repr` form (zero and magnitudes in [1e-4, 1e16); NaN is none of these).
fn plain_scalar(item: &Bound<'_, PyAny>) -> bool {
    if item.is_exact_instance_of::<PyString>()
        || item.is_exact_instance_of::<PyInt>()
        || item.is_exact_instance_of::<PyBool>()
        || item.is_none()
    {
        return true;
    }
    match item.downcast_exact::<PyFloat>() {
        Ok(float) => {
            let v = float.value();
            (1e-4..1e16).contains(&v) || (-1e16 < v && v <= -1e-4) || v == 0.0
        }
        Err(_) => false,
    }
}

/// Whether `obj` is a dict (exactly, str keys) or a list (exactly) of plain scalars: what
/// the JSON codec hands to msgspec rather than to Python's slower encoder.
#[pyfunction]
fn plain_json(obj: &Bound<'_, PyAny>) -> bool {
    if let Ok(dict) = obj.downcast_exact::<PyDict>() {
        for (key, value) in dict.iter() {
            if !key.is_exact_instance_of::<PyString>() || !plain_scalar(&value) {
                return false;
            }
        }
        return true;
    }
    if let Ok(list) = obj.downcast_exact::<PyList>() {
        for item in list.iter() {
            if !plain_scalar(&item) {
                return false;
            }
        }
        return true;
    }
    false
}

#[pymodule]
fn streamjoin_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(murmur2, module)?)?;
    module.add_function(wrap_pyfunction!(partition, module)?)?;
    module.add_function(wrap_pyfunction!(plain_json, module)?)?;
    Ok(())
}
