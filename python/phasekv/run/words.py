"""Candidate words for the prompts' keys, values and fillers.

Common short English words: most tokenizers of served models hold each of them, after a
space, as one token. The runner keeps only the words that the server's own tokenizer maps to
exactly one token in context (see phasekv.run.prompt.discover_pool); ``--words FILE`` replaces
this list.
"""

WORDS = """
apple river stone cloud tiger horse table chair green yellow purple orange silver golden
winter summer spring autumn morning evening garden forest island desert valley mountain
ocean planet rocket engine bridge castle market school doctor farmer singer painter
pilot sailor soldier teacher window mirror pocket basket bottle candle carpet button
hammer ladder pencil rabbit monkey turtle dragon eagle falcon parrot salmon spider
cotton copper marble velvet honey butter cheese bread sugar pepper lemon cherry grape
melon peach banana potato tomato onion carrot garlic violin guitar piano drum flute
trumpet camera laptop phone radio ticket letter paper circle square arrow anchor
compass helmet jacket shirt boot glove scarf ring crown sword shield wagon train truck
boat plane wheel tower temple palace village city county harbor canal lake pond beach
cliff cave field meadow orchard hill storm thunder rain snow frost wind flame smoke
ash dust sand clay brick glass steel iron gold coin jewel pearl diamond ruby amber
ivory ebony cedar maple willow oak pine birch tulip rose lily daisy orchid fern moss
wolf bear fox deer goat sheep cow pig duck goose swan owl crow bee ant frog snake
shark whale seal otter beaver badger moose zebra camel lion cat dog mouse
""".split()
