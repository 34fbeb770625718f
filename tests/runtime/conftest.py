from proxy_kit import short_dir  # noqa: F401
