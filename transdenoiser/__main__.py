from transdenoiser.cli import main

raise SystemExit(main())
