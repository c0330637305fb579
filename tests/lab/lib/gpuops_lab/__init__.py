"""The lab's parts: paths, /proc helpers, SSH, node payload, node life cycle, CLI."""
