"""The kinds of source, one package each (dirq/, amqp/, and a library's own
transport object, library/memory), each holding everything about itself, and the
registry the generic layers ask (registry). Never imports ops, flows or the CLI.
"""
