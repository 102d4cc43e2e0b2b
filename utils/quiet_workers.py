"""Imported first by the fork server of a worker pool (``set_forkserver_preload``), never otherwise: the
fork server and every worker it forks ignore SIGINT from their start. A Ctrl-C reaches the whole
process group; the parent alone handles it (it stops the pool), so the workers that are still
starting (importing torch, unpickling their task) print no ``KeyboardInterrupt`` traceback."""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
