"""The web console at ``/ui`` and the offline API docs at ``/docs`` (docs/operations.md)."""
