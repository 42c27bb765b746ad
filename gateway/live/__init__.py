"""Off-the-critical-path consumers of live traffic: the regime observer and planner loop,
and shadow evaluation. They hear about requests through `ExchangeListener` and do their
I/O (tokenize, scrape, replay) in background tasks on bounded queues."""
