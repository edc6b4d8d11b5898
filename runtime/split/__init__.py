"""The split runtime: the draft model on the edge, the target on a server, chains of draft tokens
verified in batches across many edge clients (SpecEdge-style, chains rather than trees).

Modules, one concept each:

- ``acceptance``  the one pure acceptance rule both sides share (sample-and-match on token ids)
- ``drafter``     edge side: a user's drafting session (draft KV, proposals, proactive
                  speculation beyond the in-flight block, rollback on rejection)
- ``target_kv``   server side: per-client target KV, stacked into one padded batch and split back
- ``verifier``    server side: batched verification of many clients' drafts in one forward
- ``batcher``     server side: the verification loop (short batching window, alternating cohorts)
- ``messages``    the wire messages (protobuf, built without protoc) and their validation
- ``transport``   links from an edge client to a verifier: in-process and gRPC, and the
                  delay/bandwidth shim that emulates a WAN on loopback
- ``depth``       the per-client depth controller (drafting + network ~= verification)
- ``edge_client`` one edge client: serves its user's requests by drafting and asking the server
- ``rtt_estimate`` the round trip an edge user reports: the emulated delay plus the stack time
                  its own round trips measured

Losslessness: greedy output equals greedy AD token for token; with sampling, every emitted token
is a sample of the *target* given the accepted prefix (the server samples one token per query
position; a draft token is accepted iff it equals that sample), so the output is distributed
exactly as the target's, whatever the draft proposes, and no draft probabilities cross the wire.
"""
