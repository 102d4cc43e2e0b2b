"""The commands beside Lightning's, one module per ``repro <command>`` (each has ``main(argv)``):
``sweep``, ``report``, ``claims``, ``registry``, ``analyze`` (with ``analysis_inputs``: what to analyse),
``data``, ``sync`` and ``bench``. ``reproductions/__main__.py`` dispatches to them.
"""
