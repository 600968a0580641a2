"""Where ``leveret ctl`` finds its broker: the control socket's file name in the data
directory. Shared by the server (:mod:`leveret.server.control`) and the command
(:mod:`leveret.cli.ctl`), which imports nothing of the broker."""

SOCKET_NAME = "leveret.ctl"
