"""The binding's parts that need the library but no server: loading, declarations, enums, errors, small structs."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monai_triton_ops import bindings as b
from monai_triton_ops import discovery
from monai_triton_ops.bindings import _library
from monai_triton_ops.errors import ServerNotFoundError

BINDINGS = Path(b.__file__).parent


# -- discovery: one place shared with the local server ----------------------------------------------
def _fake_library(folder: Path, name: str = "libtritonserver.so") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(b"\x7fELF")
    return folder / name


def test_library_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = _fake_library(tmp_path / "explicit")
    from_env = _fake_library(tmp_path / "env")
    home = tmp_path / "home"
    from_home = _fake_library(home / "lib")
    environ = {discovery.LIB_ENV: str(from_env), discovery.HOME_ENV: str(home)}
    assert discovery.find_triton_library(explicit, environ=environ).path == explicit.resolve()
    assert discovery.find_triton_library(explicit.parent, environ=environ).source == "path"
    assert discovery.find_triton_library(environ=environ).path == from_env.resolve()
    found = discovery.find_triton_library(environ={discovery.HOME_ENV: str(home)})
    assert (found.path, found.source) == (from_home.resolve(), discovery.HOME_ENV)
    system = tmp_path / "opt"
    from_system = _fake_library(system / "lib")
    monkeypatch.setattr(discovery, "SYSTEM_HOME", system)
    assert discovery.find_triton_library(environ={}).path == from_system.resolve()


def test_wheel_is_the_last_resort(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(discovery, "SYSTEM_HOME", tmp_path / "no-opt")
    found = discovery.find_triton_library(environ={})
    assert found.source == "nvidia-pytriton"
    assert found.path.name.startswith("libtritonserver")
    assert found.install is not None
    assert found.install.stub_path is not None
    monkeypatch.setattr(discovery, "_wheel_home", lambda: None)
    with pytest.raises(ServerNotFoundError, match="pip install --no-deps nvidia-pytriton"):
        discovery.find_triton_library(environ={})


def test_a_bad_location_is_an_error_not_a_fall_through(tmp_path: Path) -> None:
    with pytest.raises(ServerNotFoundError, match="TRITONSERVER_LIB"):
        discovery.find_triton_library(environ={discovery.LIB_ENV: str(tmp_path / "nope.so")})
    with pytest.raises(ServerNotFoundError, match="from TRITONSERVER_HOME"):
        discovery.find_triton_library(environ={discovery.HOME_ENV: str(tmp_path)})
    (tmp_path / "lib").mkdir()
    with pytest.raises(ServerNotFoundError, match=r"no libtritonserver\*\.so in"):
        discovery.find_triton_library(environ={discovery.HOME_ENV: str(tmp_path)})


def test_loading_another_library_once_loaded_is_refused(triton_library: Any, tmp_path: Path) -> None:
    assert b.load_library() is triton_library
    assert b.loaded_library() is triton_library
    with pytest.raises(b.TritonLibraryError, match="already loaded"):
        b.load_library(_fake_library(tmp_path / "other"))


def test_api_version_check() -> None:
    b.check_api_version(1, 34)
    b.check_api_version(1, 40)
    for major, minor in ((2, 0), (0, 34), (1, 33)):
        with pytest.raises(b.TritonLibraryError, match=rf"{major}\.{minor}.*1\.34"):
            b.check_api_version(major, minor)


@pytest.mark.checks("TRITONSERVER_ApiVersion")
def test_the_wheel_library_is_api_1_34(triton_library: Any) -> None:
    major, minor = ctypes.c_uint32(), ctypes.c_uint32()
    _library.lib().TRITONSERVER_ApiVersion(ctypes.byref(major), ctypes.byref(minor))
    assert (major.value, minor.value) == (1, 34)


# -- declarations ---------------------------------------------------------------------------------
def test_every_declared_function_has_restype_and_argtypes(triton_library: Any) -> None:
    cdll = _library.lib()
    for name, (restype, argtypes) in _library.DECLARATIONS.items():
        function = getattr(getattr(cdll, name), "__wrapped__", getattr(cdll, name))
        assert tuple(function.argtypes) == argtypes, name
        if restype == "error":
            assert (function.restype, function.errcheck) == (ctypes.c_void_p, _library._errcheck), name
        else:
            assert function.restype == restype, name


def test_every_c_function_the_sources_name_is_declared() -> None:
    named = set()
    for source in BINDINGS.glob("*.py"):
        named |= set(re.findall(r"\bTRITONSERVER_[A-Z][A-Za-z0-9]+\b", source.read_text()))
    structs_and_enums = {name for name in named if hasattr(b, name)}
    undeclared = named - set(_library.DECLARATIONS) - structs_and_enums - {"TRITONSERVER_Error"}
    assert not undeclared, f"called but not declared: {sorted(undeclared)}"


# -- enums and their strings ----------------------------------------------------------------------
@pytest.mark.checks(
    "TRITONSERVER_DataTypeString",
    "TRITONSERVER_StringToDataType",
    "TRITONSERVER_DataTypeByteSize",
    "TRITONSERVER_MemoryTypeString",
    "TRITONSERVER_ParameterTypeString",
    "TRITONSERVER_InstanceGroupKindString",
    "TRITONSERVER_InferenceTraceLevelString",
    "TRITONSERVER_InferenceTraceActivityString",
)
def test_enum_strings_come_from_the_library(triton_library: Any) -> None:
    assert b.TRITONSERVER_DataTypeString(b.TRITONSERVER_DataType.FP32) == "FP32"
    assert b.TRITONSERVER_StringToDataType("INT64") is b.TRITONSERVER_DataType.INT64
    assert b.TRITONSERVER_DataTypeByteSize(b.TRITONSERVER_DataType.FP16) == 2
    assert b.TRITONSERVER_MemoryTypeString(b.TRITONSERVER_MemoryType.CPU_PINNED) == "CPU_PINNED"
    assert b.TRITONSERVER_ParameterTypeString(b.TRITONSERVER_ParameterType.BOOL) == "BOOL"
    assert b.TRITONSERVER_InstanceGroupKindString(b.TRITONSERVER_InstanceGroupKind.GPU) == "GPU"
    assert b.TRITONSERVER_InferenceTraceLevelString(b.TRITONSERVER_InferenceTraceLevel.TIMESTAMPS) == "TIMESTAMPS"
    activity = b.TRITONSERVER_InferenceTraceActivity.COMPUTE_START
    assert b.TRITONSERVER_InferenceTraceActivityString(activity) == "COMPUTE_START"
    # the enum values are the header's: every data type name round-trips through the library
    for datatype in b.TRITONSERVER_DataType:
        if datatype is not b.TRITONSERVER_DataType.INVALID:
            assert b.TRITONSERVER_StringToDataType(b.TRITONSERVER_DataTypeString(datatype)) is datatype


def test_numpy_dtypes_map_both_ways() -> None:
    for dtype in (np.bool_, np.uint8, np.int16, np.int64, np.float16, np.float32, np.float64):
        assert b.numpy_dtype(b.triton_dtype(dtype)) == np.dtype(dtype)
    with pytest.raises(b.UnsupportedError, match="BYTES"):
        b.numpy_dtype(b.TRITONSERVER_DataType.BYTES)
    with pytest.raises(b.UnsupportedError, match="complex64"):
        b.triton_dtype(np.complex64)


# -- errors: the class follows the code ------------------------------------------------------------
@pytest.mark.parametrize("code", list(b.TRITONSERVER_Error_Code))
@pytest.mark.checks(
    "TRITONSERVER_ErrorNew", "TRITONSERVER_ErrorCode", "TRITONSERVER_ErrorMessage", "TRITONSERVER_ErrorCodeString"
)
def test_error_class_follows_the_code(triton_library: Any, code: b.TRITONSERVER_Error_Code) -> None:
    from monai_triton_ops.bindings._library import read_error
    from monai_triton_ops.bindings.error import ERROR_CLASSES

    error = _library.lib().TRITONSERVER_ErrorNew(int(code), b"some message")
    exc = read_error(error, owned=True)
    assert type(exc) is ERROR_CLASSES[code]
    assert exc.code is code
    assert str(exc) == "some message"
    assert exc.code_string  # Triton's own name, e.g. "Not found"


def test_error_classes_subclass_the_matching_builtins() -> None:
    assert issubclass(b.InvalidArgumentError, ValueError)
    assert issubclass(b.NotFoundError, LookupError)
    assert issubclass(b.TritonError, RuntimeError)


def test_an_exception_becomes_an_error_with_its_text(triton_library: Any) -> None:
    from monai_triton_ops.bindings._library import new_error, read_error

    exc = read_error(new_error(KeyError("OUTPUT__9")), owned=True)
    assert isinstance(exc, b.UnknownError)
    assert "KeyError" in str(exc)
    assert "OUTPUT__9" in str(exc)
    assert isinstance(read_error(new_error(b.UnavailableError("busy")), owned=True), b.UnavailableError)


# -- small structs ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("text", b.TRITONSERVER_ParameterType.STRING),
        (7, b.TRITONSERVER_ParameterType.INT),
        (True, b.TRITONSERVER_ParameterType.BOOL),
        (0.5, b.TRITONSERVER_ParameterType.DOUBLE),
        (b"\x00raw", b.TRITONSERVER_ParameterType.BYTES),
    ],
)
def test_parameters(triton_library: Any, value: Any, kind: b.TRITONSERVER_ParameterType) -> None:
    parameter = b.TRITONSERVER_Parameter("key", value)
    assert parameter.type is kind
    parameter.delete()
    with pytest.raises(b.OwnershipError, match="deleted"):
        parameter.delete()
    with pytest.raises(TypeError, match="list"):
        b.TRITONSERVER_Parameter("key", [1])  # type: ignore[arg-type]


@pytest.mark.checks("TRITONSERVER_MessageNewFromSerializedJson", "TRITONSERVER_MessageSerializeToJson")
def test_message_round_trip(triton_library: Any) -> None:
    message = b.TRITONSERVER_Message.from_serialized_json('{"a": [1, 2], "b": "é"}')
    assert message.json() == {"a": [1, 2], "b": "é"}
    message.delete()
    with pytest.raises(b.OwnershipError, match=r"deleted \(delete\(\) was called\)"):
        message.serialize_to_json()


@pytest.mark.checks(
    "TRITONSERVER_BufferAttributesNew",
    "TRITONSERVER_BufferAttributesSetMemoryType",
    "TRITONSERVER_BufferAttributesMemoryType",
    "TRITONSERVER_BufferAttributesSetMemoryTypeId",
    "TRITONSERVER_BufferAttributesMemoryTypeId",
    "TRITONSERVER_BufferAttributesSetByteSize",
    "TRITONSERVER_BufferAttributesByteSize",
    "TRITONSERVER_BufferAttributesSetCudaIpcHandle",
    "TRITONSERVER_BufferAttributesCudaIpcHandle",
)
def test_buffer_attributes(triton_library: Any) -> None:
    attributes = b.TRITONSERVER_BufferAttributes()
    attributes.memory_type = b.TRITONSERVER_MemoryType.GPU
    attributes.memory_type_id = 3
    attributes.byte_size = 1 << 33  # above 2**32: size_t must not be truncated
    assert attributes.cuda_ipc_handle is None
    attributes.cuda_ipc_handle = bytes(range(64))
    assert attributes.memory_type is b.TRITONSERVER_MemoryType.GPU
    assert (attributes.memory_type_id, attributes.byte_size) == (3, 1 << 33)
    assert attributes.cuda_ipc_handle == bytes(range(64))
    with pytest.raises(ValueError, match="64 bytes"):
        attributes.cuda_ipc_handle = b"short"
    attributes.delete()


def test_options_setters_chain(triton_library: Any, tmp_path: Path) -> None:
    options = b.TRITONSERVER_ServerOptions()
    assert options.set_server_id("x").set_strict_model_config(False) is options
    options.delete()
    with pytest.raises(b.OwnershipError):
        options.set_server_id("y")


# -- deleting frees what Triton allocated --------------------------------------------------------------
def _grows(make_and_drop: Callable[[], None], times: int) -> int:
    """RSS growth over ``times`` calls (after a warm-up that fills the allocator's caches)."""
    import gc

    from .harness import rss_bytes

    for _ in range(times // 10):
        make_and_drop()
    gc.collect()
    before = rss_bytes()
    for _ in range(times):
        make_and_drop()
    gc.collect()
    return rss_bytes() - before


_BIG = "x" * (64 << 10)


@pytest.mark.parametrize(
    ("function", "make", "times"),
    [
        ("ErrorDelete", lambda: _error_round_trip(), 2_000),
        ("MessageDelete", lambda: b.TRITONSERVER_Message.from_serialized_json(f'{{"a": "{_BIG}"}}').delete(), 2_000),
        ("ParameterDelete", lambda: b.TRITONSERVER_Parameter("p", _BIG).delete(), 2_000),  # a string is copied
        ("ServerOptionsDelete", lambda: b.TRITONSERVER_ServerOptions().delete(), 20_000),
        ("BufferAttributesDelete", lambda: b.TRITONSERVER_BufferAttributes().delete(), 100_000),
    ],
    ids=["error", "message", "parameter", "options", "buffer_attributes"],
)
def test_deleting_frees_what_triton_allocated(
    triton_library: Any, request: pytest.FixtureRequest, function: str, make: Callable[[], None], times: int
) -> None:
    """Without the deletes these loops would hold well over 4 MiB (64 KiB objects, or many small ones)."""
    request.node.add_marker(pytest.mark.checks(f"TRITONSERVER_{function}"))
    assert _grows(make, times) < 4 << 20


def _error_round_trip() -> None:
    from monai_triton_ops.bindings._library import new_error, read_error

    read_error(new_error(RuntimeError(_BIG)), owned=True)
