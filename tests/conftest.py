"""Session-wide test setup.

Eight host (CPU) devices for the sharding tests (tests/test_sharding.py, issue 6). XLA reads
``XLA_FLAGS`` when the CPU backend starts, which happens on first use anywhere in the pytest
process, so the flag is set here — before any test module is collected. Single-device tests are
unaffected: un-sharded computations still run on device 0.
"""

import os

_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {_FLAG}=8").strip()
