"""Finding libcusparseLt.so.0 and its version (CPU): fake nvidia-cusparselt-cu13 wheel layouts in
temporary site directories (dummy library files, dist-info metadata), a stand-in for the extension's
loader, and the version keying of the autotune table (``backend="auto"``)."""

from __future__ import annotations

import os
import pathlib
import re
import warnings

import jax.numpy as jnp
import pytest

from jax_sparse24._src import cuda_cusparselt_ops as lt
from jax_sparse24._src import autotune, backends, ffi

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _wheel(site: pathlib.Path, version: str, lib_rel: str | None, *, metadata: bool = True) -> pathlib.Path | None:
    """Install a fake nvidia-cusparselt-cu13 ``version`` into ``site``: the library at ``lib_rel``
    (a dummy file), and its dist-info (METADATA, RECORD listing the library) when ``metadata``."""
    site.mkdir(parents=True, exist_ok=True)
    lib = None
    record = []
    if lib_rel:
        lib = site / lib_rel
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.write_bytes(b"not an ELF file")
        record.append(f"{lib_rel},,")
    if metadata:
        di = site / f"nvidia_cusparselt_cu13-{version}.dist-info"
        di.mkdir()
        (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-cusparselt-cu13\nVersion: {version}\n")
        record.append(f"{di.name}/METADATA,,")
        (di / "RECORD").write_text("\n".join(record) + "\n")
    return lib


def test_search_path_covers_every_wheel_layout(tmp_path):
    # 0.8.x: nvidia/cusparselt/lib
    s08 = tmp_path / "site08"
    lib08 = _wheel(s08, "0.8.1", "nvidia/cusparselt/lib/libcusparseLt.so.0")
    (c, *_, system) = lt.library_candidates(paths=[str(s08)], environ={})
    assert c.path == str(lib08) and c.version == "0.8.1" and "nvidia-cusparselt-cu13 0.8.1" in c.source
    assert system.path == "libcusparseLt.so.0" and "system" in system.source  # LD_LIBRARY_PATH / ld.so.cache last
    # 0.10.x: nvidia/cu13/lib (the shared tree of the CUDA 13 wheels)
    s10 = tmp_path / "site10"
    lib10 = _wheel(s10, "0.10.0", "nvidia/cu13/lib/libcusparseLt.so.0")
    c = lt.library_candidates(paths=[str(s10)], environ={})[0]
    assert (c.path, c.version) == (str(lib10), "0.10.0")
    # a layout only the wheel's RECORD knows (a future release) is found through the metadata
    s_new = tmp_path / "site_new"
    lib_new = _wheel(s_new, "0.10.5", "nvidia/cu13/lib64/libcusparseLt.so.0")
    c = lt.library_candidates(paths=[str(s_new)], environ={})[0]
    assert (c.path, c.version) == (str(lib_new), "0.10.5")
    # the known layouts without metadata (e.g. unpacked by hand): found, version unknown until loaded
    s_bare = tmp_path / "site_bare"
    lib_bare = _wheel(s_bare, "0.10.0", "nvidia/cu13/lib/libcusparseLt.so.0", metadata=False)
    c = lt.library_candidates(paths=[str(s_bare)], environ={})[0]
    assert c.path == str(lib_bare) and c.version is None and "nvidia/cu13/lib" in c.source
    # every place, in order, each file once; the environment variable first (a directory or a file)
    paths = [str(s08), str(s10), str(s_bare), str(tmp_path / "empty")]
    got = [c.path for c in lt.library_candidates(paths=paths, environ={})]
    assert got == [str(lib08), str(lib10), str(lib_bare), "libcusparseLt.so.0"]
    got = lt.library_candidates(paths=paths, environ={lt.LIB_ENV: str(lib10.parent)})
    assert got[0].path == str(lib10) and got[0].source == f"${lt.LIB_ENV}"
    assert [c.path for c in got].count(str(lib10)) == 1
    missing = str(tmp_path / "nowhere" / "libcusparseLt.so.0")
    assert lt.library_candidates(paths=[], environ={lt.LIB_ENV: missing})[0].path == missing  # reported if it fails
    assert [c.path for c in lt.library_candidates(paths=[str(tmp_path / "empty")], environ={})] == [
        "libcusparseLt.so.0"]


def test_version_parsing_and_the_supported_range():
    assert lt.parse_version("0.10.0") == (0, 10, 0)
    assert lt.parse_version("0.8") == (0, 8, 0)
    assert lt.parse_version("0.8.1.post2") == (0, 8, 1)
    with pytest.raises(ValueError, match="not a cuSPARSELt version"):
        lt.parse_version("latest")
    assert lt.version_supported("0.8.1") and lt.version_supported((0, 10, 0)) and lt.version_supported("0.10.9")
    assert not lt.version_supported("0.8.0")  # H100 regressions, fixed in 0.8.1
    assert not lt.version_supported("0.7.1") and not lt.version_supported("0.11.0")


def test_pyproject_gpu_extra_declares_the_supported_range():
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'"nvidia-cusparselt-cu13>=([\d.]+),<([\d.]+)"', text)
    assert m, "the gpu extra must pin nvidia-cusparselt-cu13 to a range"
    lo, hi = lt.SUPPORTED_VERSIONS
    assert (lt.parse_version(m.group(1)), lt.parse_version(m.group(2))) == (lo, hi)


def test_reading_a_real_library_version_if_installed():
    """cusparseLtGetProperty needs no GPU: where the wheel is installed, the version read from the
    library equals its metadata's."""
    found = [c for c in lt.library_candidates() if c.version and os.path.isfile(c.path)]
    if not found:
        pytest.skip("nvidia-cusparselt-cu13 is not installed")
    v = lt.read_library_version(found[0].path)
    assert v == lt.parse_version(found[0].version)


class _FakeExt:
    """The extension's loader: ``cusparselt_load(path)`` succeeds only for ``loadable``."""

    def __init__(self, loadable=None):
        self.loadable = loadable
        self.tried = []

    def cusparselt_load(self, hint):
        self.tried.append(hint)
        if self.loadable is not None and os.path.exists(hint) and os.path.samefile(hint, self.loadable):
            return True, hint
        return False, "the cuSPARSELt library (libcusparseLt.so.0) could not be loaded; Tried:\n  " + hint


@pytest.fixture
def fresh_lt(monkeypatch):
    """lt._load recomputed under the test's stubs (and forgotten afterwards); warnings re-armed."""
    monkeypatch.setattr(lt, "_warned", set())
    monkeypatch.delenv(lt.LIB_ENV, raising=False)
    real = lt._load
    real.cache_clear()
    yield
    real.cache_clear()


def test_load_reports_the_wheel_version_and_warns_outside_the_range(tmp_path, monkeypatch, fresh_lt):
    site = tmp_path / "site"
    lib = _wheel(site, "0.10.0", "nvidia/cu13/lib/libcusparseLt.so.0")
    monkeypatch.syspath_prepend(str(site))
    ext = _FakeExt(loadable=lib)
    monkeypatch.setattr(ffi, "extension", lambda: ext)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0.10.0 is supported: no warning
        assert lt.cusparselt_available()
    assert ext.tried[0] == str(lib)
    assert lt.cusparselt_version() == "0.10.0"  # the dummy file has no cusparseLtGetProperty: metadata
    info = lt.cusparselt_library()
    assert info["path"] == str(lib) and info["version_source"] == "nvidia-cusparselt-cu13 metadata"

    lt._load.cache_clear()
    old = tmp_path / "old"
    lib_old = _wheel(old, "0.7.1", "nvidia/cusparselt/lib/libcusparseLt.so.0")
    monkeypatch.syspath_prepend(str(old))
    monkeypatch.setattr(ffi, "extension", lambda: _FakeExt(loadable=lib_old))
    with pytest.warns(RuntimeWarning, match=r"cuSPARSELt 0\.7\.1 .* outside the supported range >=0\.8\.1,<0\.11\.0"):
        assert lt.cusparselt_available()
    lt._load.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert lt.cusparselt_version() == "0.7.1"


def test_not_loadable_names_every_place_searched(tmp_path, monkeypatch, fresh_lt):
    site = tmp_path / "site"
    lib = _wheel(site, "0.10.0", "nvidia/cu13/lib/libcusparseLt.so.0")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(ffi, "extension", lambda: _FakeExt(loadable=None))
    assert not lt.cusparselt_available() and lt.cusparselt_version() is None
    err = lt.cusparselt_error()
    assert "could not be loaded" in err and str(lib) in err and "libcusparseLt.so.0 (system" in err
    assert "nvidia-cusparselt-cu13>=0.8.1,<0.11.0" in err
    with pytest.raises(RuntimeError, match="backend='cusparselt' is unavailable"):
        lt.require_cusparselt()


# --- the autotune table keyed on the library version -------------------------------------------
def _loaded(version):
    return lt._Loaded(True, "/x/libcusparseLt.so.0", None if version is None else lt.parse_version(version),
                      "test" if version else "")


def test_table_version_must_match_major_minor(monkeypatch, fresh_lt):
    monkeypatch.setattr(lt, "_load", lambda: _loaded("0.8.2"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lt.table_version_matches("0.8.1")  # a patch release: same measurements
        assert lt.table_version_matches(None)  # a table from before the field existed
    monkeypatch.setattr(lt, "_load", lambda: _loaded("0.10.0"))
    with pytest.warns(RuntimeWarning, match=r"measured cuSPARSELt 0\.8\.1, but version 0\.10\.0 is loaded"):
        assert not lt.table_version_matches("0.8.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        assert not lt.table_version_matches("0.8.1")
    monkeypatch.setattr(lt, "_warned", set())
    monkeypatch.setattr(lt, "_load", lambda: _loaded(None))
    with pytest.warns(RuntimeWarning, match="unknown version"):
        assert not lt.table_version_matches("0.8.1")


def test_shipped_table_records_its_cusparselt_version():
    table = autotune._table()
    assert lt.version_supported(table["cusparselt_version"])


@pytest.fixture
def lt_table(monkeypatch):
    """GPU stubs with a table where cuSPARSELt is measured fastest at (4096, 8192, 1024)."""
    from jax_sparse24._src import cuda_spmm_ops

    monkeypatch.setattr(ffi, "cuda_kernels_available", lambda: True)
    monkeypatch.setattr(backends.CUTLASS, "can_run", lambda *a, **kw: backends.OK)
    monkeypatch.setattr(cuda_spmm_ops, "cutlass_configs_kn", lambda: ["k1"])
    monkeypatch.setattr(cuda_spmm_ops, "cutlass_supports_kn", lambda *a: True)
    monkeypatch.setattr(autotune, "_config_id", lambda name: -1)
    monkeypatch.setattr(lt, "fused_compress_ok", lambda *a: True)
    monkeypatch.setattr(lt, "_warned", set())
    entry = dict(m=4096, n=8192, k=1024, dtype="bfloat16", config="k1", speedup_with_compress=1.10,
                 gemm_speedup=1.2, cusparselt_speedup_with_compress=1.30, cusparselt_gemm_speedup=1.5)
    table = {"cusparselt_version": "0.8.1", "entries": [entry], "entries_kn": []}
    monkeypatch.setattr(autotune, "_table", lambda: table)
    return table


def test_auto_uses_cusparselt_only_with_the_measured_version(monkeypatch, lt_table):
    import jax_sparse24 as s24

    monkeypatch.setattr(ffi, "extension", lambda: object())
    monkeypatch.setattr(lt, "_load", lambda: _loaded("0.8.1"))
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.bfloat16) == "cusparselt"
    assert s24.linear_plan(8192, 1024, 4096)["forward"] == "cusparselt"
    monkeypatch.setattr(lt, "_load", lambda: _loaded("0.10.0"))
    with pytest.warns(RuntimeWarning, match="does not pick cuSPARSELt"):
        assert autotune.choose("auto", 4096, 8192, 1024, jnp.bfloat16) == "cutlass"
    assert s24.linear_plan(8192, 1024, 4096)["forward"] == "cutlass"
    assert autotune.choose("cusparselt", 4096, 8192, 1024, jnp.bfloat16) == "cusparselt"  # forcing still works


def test_linear_plan_never_plans_an_unloadable_cusparselt(tmp_path, monkeypatch, lt_table, fresh_lt):
    """The table says cuSPARSELt, the library does not load (e.g. a wheel layout not searched): auto
    plans CUTLASS; forcing the backend raises with what was searched."""
    import jax_sparse24 as s24

    monkeypatch.setattr(ffi, "extension", lambda: _FakeExt(loadable=None))
    assert autotune.choose("auto", 4096, 8192, 1024, jnp.bfloat16) == "cutlass"
    assert s24.linear_plan(8192, 1024, 4096)["forward"] == "cutlass"
    assert s24.linear_plan(8192, 1024, 4096, reuse=8)["forward"] == "cutlass"
    with pytest.raises(RuntimeError, match=r"(?s)backend='cusparselt': .*could not be loaded.*Searched, in order"):
        autotune.choose("cusparselt", 4096, 8192, 1024, jnp.bfloat16)
