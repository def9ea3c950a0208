"""How clusterctl reaches hosts: the OpenSSH view of the inventory, transports, fan-out, host facts."""
