"""XLA_FLAGS for the suite's 8-virtual-device subprocesses (mesh checks)."""

import os


def eight_device_xla_flags(*extra: str) -> str:
  """The suite's XLA_FLAGS (tests/conftest.py's CHEAP_XLA_FLAGS, inherited), `extra`, then 8 host
  devices last, so that they win over a device count given before."""
  return ' '.join(filter(None, [*extra, os.environ.get('XLA_FLAGS'),
                                '--xla_force_host_platform_device_count=8']))
