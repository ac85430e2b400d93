"""The server's compute, one module per job: ``noise`` (keyed per-image noise seeds), ``engine`` (a request's
certificate as noise jobs evaluated in shared forward passes) and ``scheduler`` (the round-robin scheduler that
shares forward passes fairly among requests, with deadlines, disconnects and a bounded queue)."""
