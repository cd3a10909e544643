"""Reports: per-segment tables and figures from recordings, reproducing the course assignments' experiments."""
