"""The processes tailguard starts and supervises: the embedded broker, the services and the local
Spark cluster's daemons (`supervised`), the process trees below them (`trees`), and how one in
the foreground learns to stop (`signals`)."""
