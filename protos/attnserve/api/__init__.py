"""attnserve.api: the contract both ends share, beside the wire's stubs (attnserve.v1).

The request and result types (generation), their protobuf conversion (convert) and the choice of a target
language (language_detection). Imports only the stubs and the standard library: the server, the clients and
the client distribution (clients/standalone/) all read these same files.
"""
