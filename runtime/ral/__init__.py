"""ral: the shell language every agent speaks (lexer, parser, elaborator, evaluator, values).

The public surface is :mod:`runtime.ral.session` (``Session``, ``RunResult``, ``ErrorInfo``),
:mod:`runtime.ral.values`, :mod:`runtime.ral.codec` and :mod:`runtime.ral.context`.
"""
