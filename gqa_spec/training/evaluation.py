"""Deprecated path of `gqa_spec.evaluation.evaluator` (moved in the layers change of issue 24).

Gin files written for earlier versions say `from gqa_spec.training import evaluation` and bind
`evaluation.InferenceEvaluator` / `evaluation.evaluate_checkpoint`. This module *is* the evaluator
module under its old name (the same module object in `sys.modules`), so such bindings reach the
functions the library calls; importing it warns once.
"""

import sys
import warnings

from gqa_spec.evaluation import evaluator

warnings.warn('gqa_spec.training.evaluation moved to gqa_spec.evaluation.evaluator; update the '
              'import (gin: `from gqa_spec.evaluation import evaluator`)', FutureWarning, stacklevel=2)
sys.modules[__name__] = evaluator
