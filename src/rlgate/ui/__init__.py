"""The trajectory viewer: the live /ui pages and the static export (`rlgate view`)."""
