"""The model lifecycle: discovery and loads (``registry``), served versions and their holders (``served``),
opening and warming a version (``loader``), refused versions (``refusals``), pacing a load (``pacing``), admin
decisions shared by the workers (``control``). Plain data and exceptions only: no HTTP, no API JSON."""
