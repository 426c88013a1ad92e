"""The Strands model provider: SGLang's native ``/generate`` token-in/token-out.

``client`` speaks HTTP to SGLang, ``chat`` renders the chat template incrementally, ``trajectory`` keeps the
token ids, loss mask and logprobs (with their invariants), ``tool_parsers`` reads tool calls out of the model's
text, ``limits`` stops runaway tool loops, and ``model`` ties them into a Strands ``Model``.
"""
