"""Admin routes of online training: the canary's state and the operator's pin / promote / rollback."""
