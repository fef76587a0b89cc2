"""Running the model to produce tokens: ``generate`` (prefill, decode_step, generate),
``sampling`` (temperature / top-k / top-p / min-p, then one draw) and ``phases`` (timing the
two phases). Uses only :mod:`tokenflow.model`."""
