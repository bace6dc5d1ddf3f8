"""`python -m gpudoctor`: the same entry point as the console script."""
from gpudoctor.entry import main

main()
