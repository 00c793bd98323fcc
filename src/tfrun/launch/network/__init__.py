"""The network the tasks meet on: private namespaces, the loopback bind, ports,
the rendezvous.
"""
