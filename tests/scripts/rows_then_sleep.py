"""A stand-in benchmark for `test_device_check`: prints two JSON rows, then outlives any clock."""
import json
import sys
import time

for i in range(2):
  print(json.dumps({'row': i}), flush=True)
if '--no-sleep' not in sys.argv:
  time.sleep(120)
