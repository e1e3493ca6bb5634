"""ral: the shell language every agent speaks (lexer, parser, elaborator, evaluator, values).

The public surface is :mod:`runtime.ral.session` (``Session``, ``RunResult``, ``ErrorInfo``),
:mod:`runtime.ral.values`, :mod:`runtime.ral.codec` and :mod:`runtime.ral.context`.

Layers, bottom first. A module imports only modules of lower layers -- every import counts,
function-local and ``TYPE_CHECKING`` ones too (tests/ral/test_layers.py) -- so the package has
no import cycle and can be read from the bottom up:

1. ``errors`` (typed errors), ``grants`` (capabilities), ``nodes`` (the syntax tree);
2. ``lexer``, ``pattern`` (RE2 patterns), ``values`` (values: equality, rendering, size),
   ``confine`` (file access inside the granted roots);
3. ``parser`` (tokens to nodes), ``context`` (cwd, env, grants; the ``Desk`` and
   ``WorkerBackend`` protocols);
4. ``interp`` (``Interp``: the state of one evaluation, external programs; ``Native``, a Σ entry);
5. ``calls`` (``Activation`` records, closure and native calls), ``files`` (file builtins);
6. ``compile`` (the elaborator, and ``use``);
7. ``codec`` (msgpack; decoding a closure re-compiles it), ``natives`` (Σ);
8. ``workers`` (the REPL's thread workers, which build a Σ per worker);
9. ``session`` (``Session``: parse, compile, run against the persistent scope).

Dependencies that would point upward are passed in instead: Σ is built by the caller and handed
to ``Interp``; the desk and the worker backend are protocols in ``context``; a closure holds its
compiled body through the ``values.CompiledBody`` protocol.
"""
