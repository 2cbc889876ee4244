"""dpeval's harness: the core layer (``harness.core``), the engine (``harness.engine``) and the application
(cli, config, runner, store, sweep, leaderboard, report, audit). docs/architecture.md draws the layers."""

__version__ = "0.1.0"
