// Prints values of java.util.Random itself, the golden data of java_random_test.cc.
// Run: cd tests/core/lessons && javac -d /tmp JavaRandomGolden.java && java -cp /tmp JavaRandomGolden
// Doubles and floats are printed as raw bits so the C++ test compares them exactly.
import java.util.Random;

public class JavaRandomGolden {
    // Exposes the protected next(bits).
    static class Exposed extends Random {
        Exposed(long seed) { super(seed); }
        int bits(int n) { return next(n); }
    }

    public static void main(String[] args) {
        long[] seeds = {0L, 1L, 3L, 42L, -7L, 123456789012345L, Long.MIN_VALUE};
        for (long seed : seeds) {
            Exposed e = new Exposed(seed);
            StringBuilder sb = new StringBuilder();
            sb.append(String.format("{%dLL, {%d, %d, %d}, {", seed, e.bits(32), e.bits(17), e.bits(1)));
            Random r = new Random(seed);
            // nextDouble, then gaussians (a pair: the second comes from the cache), then a
            // nextDouble between a fresh gaussian and its cached partner.
            sb.append(String.format("0x%016xULL, ", Double.doubleToRawLongBits(r.nextDouble())));
            for (int i = 0; i < 3; i++) sb.append(String.format("0x%016xULL, ", Double.doubleToRawLongBits(r.nextGaussian())));
            sb.append(String.format("0x%016xULL, ", Double.doubleToRawLongBits(r.nextDouble())));
            sb.append(String.format("0x%016xULL}, {", Double.doubleToRawLongBits(r.nextGaussian())));
            // The lessons' draws: (float) (nextGaussian() * 0.5), and with std 0.1.
            Random l = new Random(seed);
            for (int i = 0; i < 4; i++) sb.append(String.format("0x%08xu, ", Float.floatToRawIntBits((float) (l.nextGaussian() * 0.5))));
            for (int i = 0; i < 3; i++) sb.append(String.format("0x%08xu%s", Float.floatToRawIntBits((float) (l.nextGaussian() * 0.1)), i < 2 ? ", " : ""));
            sb.append("}},");
            System.out.println(sb);
        }
        // A long run: h = h * 31 + bits over 1,000,000 nextGaussian draws, per seed.
        for (long seed : new long[] {1L, 3L, 42L}) {
            Random r = new Random(seed);
            long h = 0;
            for (int i = 0; i < 1000000; i++) h = h * 31 + Double.doubleToRawLongBits(r.nextGaussian());
            System.out.println(String.format("{%dLL, 0x%016xULL},", seed, h));
        }
        // StrictMath.log at awkward arguments: near 1, tiny, subnormal, huge.
        double[] xs = {0.999999, 1.0000001, 0.5, 0.75, 1e-300, 4.9e-324, 1e300, 0.1234567, 0.9};
        for (double x : xs) {
            System.out.println(String.format("{0x%016xULL, 0x%016xULL},", Double.doubleToRawLongBits(x),
                Double.doubleToRawLongBits(StrictMath.log(x))));
        }
    }
}
