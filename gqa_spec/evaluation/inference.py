"""Deprecated path of `gqa_spec.evaluation.infer` (moved in the layers change of issue 24).

Gin files written for earlier versions say `from gqa_spec.evaluation import inference` and bind
`inference.infer`. This module *is* the infer module under its old name (the same module object in
`sys.modules`), so such bindings reach the function the library calls; importing it warns once.
"""

import sys
import warnings

from gqa_spec.evaluation import infer

warnings.warn('gqa_spec.evaluation.inference moved to gqa_spec.evaluation.infer; update the '
              'import (gin: `from gqa_spec.evaluation import infer`)', FutureWarning, stacklevel=2)
sys.modules[__name__] = infer
