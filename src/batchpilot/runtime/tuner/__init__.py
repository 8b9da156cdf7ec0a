"""The autotuner's rules, layered (see `state.py`); `runtime/autotuner.py` assembles them."""
