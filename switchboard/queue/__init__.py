"""③ The session queue: Redis and RQ. The only package that imports rq."""
