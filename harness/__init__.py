"""dpeval's harness: the core layer (``dpeval.core``), the engine (``dpeval.engine``) and the application
(cli, config, runner, store, sweep, leaderboard, report, audit). docs/architecture.md draws the layers."""

__version__ = "0.1.0"
