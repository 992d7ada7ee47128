"""Read TensorFlow (V2, "tensor bundle") checkpoints without TensorFlow.

A checkpoint `PREFIX` is `PREFIX.index`, an SSTable (LevelDB's table format) mapping each variable name to a
serialized `BundleEntryProto` (dtype, shape, data shard, offset, size, CRC32C), and the data shards
`PREFIX.data-00000-of-0000N` holding the raw little-endian tensor bytes. The empty key holds the
`BundleHeaderProto` (number of shards, endianness). Only the few protobuf fields needed are decoded, by hand.

Everything read is checked: table magic and block checksums, each tensor's extent against its shard's size, and
its CRC32C; a problem is a `TFCheckpointError` with one line naming the file and the variable.
"""

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io.files import ElmoInputError

_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48  # two block handles padded to 40 bytes, then the magic
_BLOCK_TRAILER_SIZE = 5  # compression type, masked CRC32C

# tensorflow/core/framework/types.proto -> numpy (little-endian; the header can say big-endian)
_DTYPES = {
    1: "f4",
    2: "f8",
    3: "i4",
    4: "u1",
    5: "i2",
    6: "i1",
    9: "i8",
    10: "?",
    17: "u2",
    19: "f2",
    22: "u4",
    23: "u8",
}
_DTYPE_NAMES = {7: "string", 8: "complex64", 14: "bfloat16", 18: "complex128"}


class TFCheckpointError(ElmoInputError):
    """A missing, truncated or damaged TensorFlow checkpoint; the message is one line naming the file."""


# --- CRC32C (Castagnoli), as TensorFlow's tables and bundles use it -------------------------------


def _crc32c_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1).astype(np.uint32)
    return table


_CRC_TABLE = _crc32c_table()
_CHUNK = 4096


def _shift_tables(length: int) -> np.ndarray:
    """`(4, 256)` tables giving the CRC register after `length` zero bytes, byte by byte of the register."""
    register = np.uint32(1) << np.arange(32, dtype=np.uint32)  # every basis vector at once
    for _ in range(length):
        register = _CRC_TABLE[register & 0xFF] ^ (register >> 8)
    tables = np.zeros((4, 256), dtype=np.uint32)
    values = np.arange(256)
    for byte in range(4):
        for bit in range(8):
            tables[byte] ^= np.where(values >> bit & 1, register[8 * byte + bit], 0).astype(np.uint32)
    return tables


_SHIFT = None


def crc32c(data: bytes) -> int:
    """CRC32C of `data`, computed in 4 KiB chunks side by side (numpy) and combined through the linearity of CRCs."""
    global _SHIFT
    if len(data) < 4 * _CHUNK:
        crc = 0xFFFFFFFF
        for byte in data:
            crc = int(_CRC_TABLE[(crc ^ byte) & 0xFF]) ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF
    if _SHIFT is None:
        _SHIFT = _shift_tables(_CHUNK)
    array = np.frombuffer(data, dtype=np.uint8).copy()
    array[:4] ^= 0xFF  # the initial register 0xFFFFFFFF is the first four bytes inverted, from a zero register
    # Leading zero bytes leave a zero register unchanged: pad in front to whole chunks.
    array = np.concatenate([np.zeros(-len(array) % _CHUNK, dtype=np.uint8), array]).reshape(-1, _CHUNK)
    registers = np.zeros(len(array), dtype=np.uint32)
    for column in array.T:
        registers = _CRC_TABLE[(registers ^ column) & 0xFF] ^ (registers >> 8)
    crc = 0
    for register in registers.tolist():
        low = _SHIFT[0, crc & 0xFF] ^ _SHIFT[1, crc >> 8 & 0xFF]
        crc = int(low ^ _SHIFT[2, crc >> 16 & 0xFF] ^ _SHIFT[3, crc >> 24]) ^ register
    return crc ^ 0xFFFFFFFF


def unmask_crc(masked: int) -> int:
    """LevelDB's stored CRCs are rotated and offset, so that a CRC of data holding CRCs stays meaningful."""
    rotated = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rotated >> 17) | (rotated << 15)) & 0xFFFFFFFF


# --- protobuf wire format and the table's varints ------------------------------------------------------


def _varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise IndexError("varint runs past the end")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7


def _fields(message: bytes) -> list[tuple[int, int | bytes]]:
    """`(field number, value)` of a protobuf message: ints for varint/fixed fields, bytes for length-delimited."""
    fields, position = [], 0
    while position < len(message):
        key, position = _varint(message, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, position = _varint(message, position)
        elif wire_type == 1:
            value, position = int.from_bytes(message[position : position + 8], "little"), position + 8
        elif wire_type == 2:
            length, position = _varint(message, position)
            value, position = message[position : position + length], position + length
        elif wire_type == 5:
            value, position = int.from_bytes(message[position : position + 4], "little"), position + 4
        else:
            raise IndexError(f"unknown wire type {wire_type}")
        if position > len(message):
            raise IndexError("field runs past the end")
        fields.append((number, value))
    return fields


@dataclass(frozen=True)
class TFVariable:
    """Where one variable of a checkpoint lives."""

    name: str
    dtype: str  # numpy dtype string, e.g. "<f4"; "" for a type this reader cannot decode
    dtype_name: str
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int | None  # masked, as stored
    sliced: bool


def _parse_entry(name: str, message: bytes, byte_order: str) -> TFVariable:
    dtype_code, shape, shard, offset, size, crc, sliced = 0, (), 0, 0, 0, None, False
    for number, value in _fields(message):
        if number == 1:
            dtype_code = value
        elif number == 2:
            dims = [v for n, v in _fields(value) if n == 2]
            shape = tuple(next((s for n, s in _fields(d) if n == 1), 0) for d in dims)
        elif number == 3:
            shard = value
        elif number == 4:
            offset = value
        elif number == 5:
            size = value
        elif number == 6:
            crc = value
        elif number == 7:
            sliced = True
    dtype = byte_order + _DTYPES[dtype_code] if dtype_code in _DTYPES else ""
    dtype_name = np.dtype(dtype).name if dtype else _DTYPE_NAMES.get(dtype_code, f"TensorFlow type {dtype_code}")
    return TFVariable(name, dtype, dtype_name, shape, shard, offset, size, crc, sliced)


# --- the SSTable -------------------------------------------------------------------------------------


def _read_block(data: bytes, handle: bytes, path: str) -> bytes:
    offset, position = _varint(handle, 0)
    size, _ = _varint(handle, position)
    end = offset + size + _BLOCK_TRAILER_SIZE
    if end > len(data) - _FOOTER_SIZE:
        raise TFCheckpointError(f"{path}: truncated or damaged index (a block ends past the end of the file)")
    block, compression = data[offset : offset + size], data[offset + size]
    stored = int.from_bytes(data[offset + size + 1 : end], "little")
    if unmask_crc(stored) != crc32c(data[offset : offset + size + 1]):
        raise TFCheckpointError(f"{path}: damaged index (checksum mismatch in the block at byte {offset})")
    if compression != 0:
        raise TFCheckpointError(
            f"{path}: index block compressed with method {compression}; only uncompressed tables (what TensorFlow "
            "writes for checkpoints) can be read"
        )
    return block


def _block_entries(block: bytes) -> list[tuple[bytes, bytes]]:
    num_restarts = int.from_bytes(block[-4:], "little")
    end = len(block) - 4 - 4 * num_restarts
    entries, key, position = [], b"", 0
    while position < end:
        shared, position = _varint(block, position)
        unshared, position = _varint(block, position)
        value_size, position = _varint(block, position)
        key = key[:shared] + block[position : position + unshared]
        position += unshared
        entries.append((key, block[position : position + value_size]))
        position += value_size
    return entries


def _table_entries(path: str) -> list[tuple[bytes, bytes]]:
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise TFCheckpointError(f"{path}: cannot read the checkpoint index ({error.strerror or error})") from None
    if len(data) < _FOOTER_SIZE or struct.unpack("<Q", data[-8:])[0] != _TABLE_MAGIC:
        raise TFCheckpointError(
            f"{path}: not a TensorFlow checkpoint index (no table footer; truncated or another file)"
        )
    try:
        footer = data[-_FOOTER_SIZE:-8]
        _, position = _varint(footer, _varint(footer, 0)[1])  # skip the meta-index handle
        index_handle = footer[position:]
        entries = []
        for _, handle in _block_entries(_read_block(data, index_handle, path)):
            entries += _block_entries(_read_block(data, handle, path))
    except IndexError:
        raise TFCheckpointError(f"{path}: damaged checkpoint index (an entry runs past its block)") from None
    return entries


# --- the checkpoint --------------------------------------------------------------------------------


def _checkpoint_prefix(path: str | os.PathLike) -> Path:
    """The prefix (`.../model.ckpt-252`) of a checkpoint given as a folder, a prefix or its `.index` file."""
    path = Path(path)
    if path.is_dir():
        state = path / "checkpoint"
        if state.is_file():
            text = state.read_text(encoding="utf-8", errors="replace")
            found = re.search(r'^model_checkpoint_path:\s*"((?:[^"\\]|\\.)*)"', text, re.MULTILINE)
            if found is None:
                raise TFCheckpointError(f"{state}: no model_checkpoint_path line in this checkpoint-state file")
            named = Path(found.group(1).encode("utf-8").decode("unicode_escape"))
            prefix = named if named.is_absolute() else path / named
            # Checkpoints are often copied from the machine that wrote them: try the name next to the state file.
            if not Path(f"{prefix}.index").is_file() and Path(f"{path / named.name}.index").is_file():
                prefix = path / named.name
            if not Path(f"{prefix}.index").is_file():
                raise TFCheckpointError(f"{state}: names checkpoint {str(named)!r}, but {prefix}.index does not exist")
            return prefix
        indexes = sorted(path.glob("*.index"))
        if len(indexes) != 1:
            found = f"{len(indexes)} .index files" if indexes else "no .index file"
            raise TFCheckpointError(
                f"{path}: no 'checkpoint' state file and {found}; give the checkpoint prefix (e.g. {path}/model.ckpt-N)"
            )
        return indexes[0].with_suffix("")
    if path.suffix == ".index" and path.is_file():
        return path.with_suffix("")
    if Path(f"{path}.index").is_file():
        return path
    raise TFCheckpointError(f"{path}: no such TensorFlow checkpoint (neither a folder nor a prefix with a .index file)")


class TFCheckpoint:
    """The variables of a TensorFlow V2 checkpoint.

    `TFCheckpoint(path)` takes the checkpoint folder (with its `checkpoint` state file), the prefix
    (`.../model.ckpt-252`) or the `.index` file. `checkpoint.variables` maps names to `TFVariable`;
    `checkpoint.read(name)` returns a numpy array, read and checked on demand.
    """

    def __init__(self, path: str | os.PathLike):
        self.prefix = _checkpoint_prefix(path)
        self.index_path = f"{self.prefix}.index"
        entries = _table_entries(self.index_path)
        header = next((value for key, value in entries if key == b""), None)
        if header is None:
            raise TFCheckpointError(f"{self.index_path}: no bundle header; not a TensorFlow V2 checkpoint index")
        try:
            header_fields = dict(_fields(header))
            byte_order = ">" if header_fields.get(2, 0) == 1 else "<"
            self.num_shards = header_fields.get(1, 1)
            self.variables = {
                key.decode("utf-8"): _parse_entry(key.decode("utf-8"), value, byte_order)
                for key, value in entries
                if key
            }
        except (IndexError, UnicodeDecodeError):
            raise TFCheckpointError(
                f"{self.index_path}: damaged checkpoint index (an entry cannot be decoded)"
            ) from None

    def shard_path(self, shard: int) -> str:
        return f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}"

    def __contains__(self, name: str) -> bool:
        return name in self.variables

    def read(self, name: str) -> np.ndarray:
        """The value of variable `name`, checked against its recorded size and checksum."""
        variable = self.variables.get(name)
        if variable is None:
            raise TFCheckpointError(f"{self.index_path}: no variable {name!r} in this checkpoint")
        if variable.sliced:
            raise TFCheckpointError(f"{self.index_path}: variable {name!r} is partitioned into slices, not supported")
        if not variable.dtype:
            raise TFCheckpointError(
                f"{self.index_path}: variable {name!r} has type {variable.dtype_name}, not a number"
            )
        expected = int(np.prod(variable.shape, dtype=np.int64)) * np.dtype(variable.dtype).itemsize
        if variable.size != expected:
            raise TFCheckpointError(
                f"{self.index_path}: variable {name!r} records {variable.size} bytes, but {variable.dtype_name} "
                f"{variable.shape} needs {expected}"
            )
        shard = self.shard_path(variable.shard)
        try:
            with open(shard, "rb") as f:
                file_size = os.fstat(f.fileno()).st_size
                if variable.offset + variable.size > file_size:
                    raise TFCheckpointError(
                        f"{shard}: truncated: variable {name!r} needs bytes {variable.offset}.."
                        f"{variable.offset + variable.size} but the file has {file_size}"
                    )
                f.seek(variable.offset)
                data = f.read(variable.size)
        except FileNotFoundError:
            raise TFCheckpointError(
                f"{shard}: missing data shard {variable.shard + 1} of {self.num_shards} (holds variable {name!r})"
            ) from None
        except IsADirectoryError:
            raise TFCheckpointError(f"{shard}: is a folder, expected the data shard holding {name!r}") from None
        if variable.crc32c is not None and unmask_crc(variable.crc32c) != crc32c(data):
            raise TFCheckpointError(f"{shard}: damaged: the bytes of variable {name!r} do not match their checksum")
        return np.frombuffer(data, dtype=variable.dtype).reshape(variable.shape).astype(variable.dtype[1:])


__all__ = ["TFCheckpoint", "TFCheckpointError", "TFVariable", "crc32c"]
