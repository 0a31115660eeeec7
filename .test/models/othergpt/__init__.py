"""othergpt: a small GPT written the way many open GPT repositories are, standing in for a model
a user copies unchanged from another project (trainscale's CI study .test/thirdparty.yaml).

It is not trainscale's code and does not follow trainscale's contract, on purpose:
- the constructor takes a config object, prints its parameter count to stdout and logs;
- the token embedding and the head share one Parameter (weight tying by assignment);
- every linear layer has a bias, and attention keeps its causal mask as a buffer;
- `forward(idx, targets=None)` returns `(logits, loss)` and warns when it has no targets.
The adapter beside it (othergpt_adapter.py) is what trainscale's `models:` entry names.
"""

from othergpt.model import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
